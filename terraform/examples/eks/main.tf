# Larder in an existing EKS cluster, reading two buckets, with an S3 gateway endpoint.
terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40"
    }
    helm = {
      source  = "hashicorp/helm"
      version = ">= 2.12, < 3.0"
    }
  }
}

variable "cluster_name" {
  description = "The EKS cluster to install into."
  type        = string
}

variable "region" {
  description = "Region of the cluster and the buckets."
  type        = string
  default     = "eu-west-1"
}

variable "image_repository" {
  description = "Where the Larder image (built from the repository's Dockerfile) is pushed."
  type        = string
}

provider "aws" {
  region = var.region
}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

data "aws_eks_cluster_auth" "this" {
  name = var.cluster_name
}

data "aws_iam_openid_connect_provider" "this" {
  url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer
}

data "aws_route_tables" "private" {
  vpc_id = data.aws_eks_cluster.this.vpc_config[0].vpc_id
}

provider "helm" {
  kubernetes {
    host                   = data.aws_eks_cluster.this.endpoint
    cluster_ca_certificate = base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)
    token                  = data.aws_eks_cluster_auth.this.token
  }
}

module "larder" {
  source = "../../modules/larder-eks"

  chart_path         = "${path.module}/../../../charts/larder"
  image_repository   = var.image_repository
  region             = var.region
  oidc_provider_arn  = data.aws_iam_openid_connect_provider.this.arn
  oidc_provider_url  = data.aws_eks_cluster.this.identity[0].oidc[0].issuer
  read_buckets       = ["analytics-lake", "analytics-logs"]
  client_keys_secret = "larder-client-keys"
  storage_class      = "local-nvme"
  disk_size          = "900Gi"
  disk_capacity      = "850GiB"
  larder_config = {
    memory_capacity = "8GiB"
    metadata_ttl    = "5m"
  }
  chart_values = {
    metrics    = { serviceMonitor = { enabled = true }, prometheusRule = { enabled = true } }
    dashboards = { enabled = true }
  }

  create_s3_gateway_endpoint = true
  vpc_id                     = data.aws_eks_cluster.this.vpc_config[0].vpc_id
  route_table_ids            = data.aws_route_tables.private.ids
}

output "endpoint" {
  description = "Point S3 clients in the cluster here."
  value       = module.larder.endpoint
}
