# The S3 permissions Larder needs, shared by the deployment modules: list and read the buckets it
# caches, write only those clients may write through it, and take S3 events from a queue if one
# is named. No provider calls: a policy
# document rendered from its inputs.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40"
    }
  }
}

variable "read_buckets" {
  description = "Buckets Larder may list and read."
  type        = list(string)
}

variable "write_buckets" {
  description = "Buckets clients may also write through Larder."
  type        = list(string)
  default     = []
}

variable "events_queue_arn" {
  description = "ARN of the SQS queue Larder polls for S3 events (events_sqs_queue_url); null: none."
  type        = string
  default     = null
}

locals {
  all_buckets = distinct(concat(var.read_buckets, var.write_buckets))
}

data "aws_iam_policy_document" "s3" {
  statement {
    sid       = "List"
    actions   = ["s3:ListBucket", "s3:ListBucketVersions", "s3:GetBucketLocation"]
    resources = [for b in local.all_buckets : "arn:aws:s3:::${b}"]
  }
  statement {
    sid       = "Read"
    actions   = ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectAttributes", "s3:GetObjectTagging"]
    resources = [for b in local.all_buckets : "arn:aws:s3:::${b}/*"]
  }
  dynamic "statement" {
    for_each = length(var.write_buckets) > 0 ? [1] : []
    content {
      sid = "Write"
      actions = [
        "s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectTagging",
        "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
      ]
      resources = [for b in var.write_buckets : "arn:aws:s3:::${b}/*"]
    }
  }
  dynamic "statement" {
    for_each = var.events_queue_arn == null ? [] : [1]
    content {
      sid       = "EventQueue"
      actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
      resources = [var.events_queue_arn]
    }
  }
}

output "json" {
  description = "The policy document."
  value       = data.aws_iam_policy_document.s3.json
}
