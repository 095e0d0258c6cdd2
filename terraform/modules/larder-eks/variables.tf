variable "name" {
  description = "Helm release name; also prefixes the IAM role."
  type        = string
  default     = "larder"
}

variable "namespace" {
  description = "Namespace to install Larder into (created if missing)."
  type        = string
  default     = "larder"
}

variable "chart_path" {
  description = "Path to the Larder chart (charts/larder in this repository)."
  type        = string
}

variable "image_repository" {
  description = "Repository of the Larder image built from the repository's Dockerfile."
  type        = string
}

variable "image_tag" {
  description = "Image tag; empty uses the chart's appVersion."
  type        = string
  default     = ""
}

variable "oidc_provider_arn" {
  description = "ARN of the EKS cluster's IAM OIDC provider (for IRSA)."
  type        = string
}

variable "oidc_provider_url" {
  description = "Issuer URL of the cluster's OIDC provider, with or without https://."
  type        = string
}

variable "read_buckets" {
  description = "Buckets Larder may read (GetObject, HeadObject, ListBucket)."
  type        = list(string)
  validation {
    condition     = length(var.read_buckets) > 0
    error_message = "List at least one bucket."
  }
}

variable "write_buckets" {
  description = "Buckets clients may also write through Larder (PutObject, DeleteObject, multipart). Empty: read-only."
  type        = list(string)
  default     = []
}

variable "client_keys_secret" {
  description = "Name of an existing Kubernetes Secret in the namespace with the client keys file under `credentials`."
  type        = string
}

variable "replicas" {
  description = "Larder replicas."
  type        = number
  default     = 2
}

variable "disk_size" {
  description = "Size of each replica's cache volume (Kubernetes quantity)."
  type        = string
  default     = "500Gi"
}

variable "disk_capacity" {
  description = "Bytes of the volume the cache uses (Larder size, e.g. 450GiB)."
  type        = string
  default     = "450GiB"
}

variable "storage_class" {
  description = "StorageClass for the cache volumes, ideally local NVMe; empty uses the cluster default."
  type        = string
  default     = ""
}

variable "region" {
  description = "Region of the buckets."
  type        = string
}

variable "larder_config" {
  description = "Extra Larder options (TOML keys from docs/configuration.md) for the chart's `config` value."
  type        = map(any)
  default     = {}
}

variable "chart_values" {
  description = "Further chart values, merged over the ones this module sets."
  type        = any
  default     = {}
}

variable "create_s3_gateway_endpoint" {
  description = "Create an S3 gateway VPC endpoint, so Larder reaches S3 without a NAT gateway (and its per-GB charge)."
  type        = bool
  default     = false
}

variable "vpc_id" {
  description = "VPC of the cluster; needed with create_s3_gateway_endpoint."
  type        = string
  default     = ""
}

variable "route_table_ids" {
  description = "Route tables of the nodes' subnets; needed with create_s3_gateway_endpoint."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for AWS resources."
  type        = map(string)
  default     = {}
}

variable "events_queue_arn" {
  description = "ARN of an SQS queue of S3 events Larder polls (set events_sqs_queue_url to its URL); the role may receive and delete its messages. null: none."
  type        = string
  default     = null
}
