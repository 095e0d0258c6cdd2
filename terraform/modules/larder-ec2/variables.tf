variable "name" {
  description = "Name prefix for every resource."
  type        = string
  default     = "larder"
}

variable "vpc_id" {
  description = "VPC to run in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets, one per availability zone, for the instances and the internal NLB."
  type        = list(string)
}

variable "client_cidrs" {
  description = "CIDR blocks of the S3 clients allowed to reach Larder's S3 port."
  type        = list(string)
}

variable "admin_cidrs" {
  description = "CIDR blocks allowed to the admin port (metrics, status page, warm-up API)."
  type        = list(string)
  default     = []
}

variable "instance_type" {
  description = "An instance type with NVMe instance storage (i4i, i3en, m6id, c6id, r6id ...)."
  type        = string
  default     = "i4i.xlarge"
}

variable "instance_count" {
  description = "Instances in the Auto Scaling group."
  type        = number
  default     = 2
}

variable "larder_binary_url" {
  description = "s3:// or https:// URL of the larder binary (target/release/larder, built as CI builds it)."
  type        = string
}

variable "client_keys_parameter" {
  description = "Name of an SSM SecureString parameter holding the client keys file (access_key_id:secret_access_key lines)."
  type        = string
}

variable "read_buckets" {
  description = "Buckets Larder may read."
  type        = list(string)
}

variable "write_buckets" {
  description = "Buckets clients may also write through Larder. Empty: read-only."
  type        = list(string)
  default     = []
}

variable "memory_capacity" {
  description = "Larder's memory tier (Larder size); leave room for the OS."
  type        = string
  default     = "16GiB"
}

variable "disk_capacity" {
  description = "Bytes of the instance-store NVMe device the cache uses (Larder size)."
  type        = string
  default     = "800GiB"
}

variable "larder_config" {
  description = "Extra Larder options as TOML lines appended to larder.toml."
  type        = string
  default     = ""
}

variable "log_retention_days" {
  description = "Retention of the CloudWatch log group Larder's JSON logs go to."
  type        = number
  default     = 14
}

variable "log_kms_key_arn" {
  description = "KMS key to encrypt the log group with; null uses CloudWatch's own encryption."
  type        = string
  default     = null
}

variable "deletion_protection" {
  description = "Protect the NLB from deletion (turn off before terraform destroy)."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}

variable "events_queue_arn" {
  description = "ARN of an SQS queue of S3 events Larder polls (set events_sqs_queue_url to its URL); the role may receive and delete its messages. null: none."
  type        = string
  default     = null
}
