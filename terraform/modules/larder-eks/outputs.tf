output "role_arn" {
  description = "ARN of the IAM role Larder's service account assumes."
  value       = aws_iam_role.larder.arn
}

output "endpoint" {
  description = "S3 endpoint URL for clients inside the cluster."
  value       = "http://${var.name}.${var.namespace}.svc:9000"
}

output "s3_gateway_endpoint_id" {
  description = "ID of the S3 gateway VPC endpoint, if created."
  value       = one(aws_vpc_endpoint.s3[*].id)
}
