# Larder on two i4i.xlarge instances (937 GB NVMe instance store each) behind an internal NLB.
terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40"
    }
  }
}

variable "region" {
  description = "Region to run in."
  type        = string
  default     = "eu-west-1"
}

variable "vpc_id" {
  description = "VPC to run in."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets, one per zone."
  type        = list(string)
}

provider "aws" {
  region = var.region
}

module "larder" {
  source = "../../modules/larder-ec2"

  vpc_id                = var.vpc_id
  subnet_ids            = var.private_subnet_ids
  client_cidrs          = ["10.0.0.0/8"]
  admin_cidrs           = ["10.20.0.0/16"]
  instance_type         = "i4i.xlarge"
  instance_count        = 2
  larder_binary_url     = "s3://my-artifacts/larder/0.1.0/larder"
  client_keys_parameter = "/larder/client-keys"
  read_buckets          = ["analytics-lake"]
  memory_capacity       = "24GiB"
  disk_capacity         = "850GiB"
  larder_config         = "metadata_ttl = \"5m\""
}

output "endpoint" {
  description = "Point S3 clients here."
  value       = module.larder.endpoint
}
