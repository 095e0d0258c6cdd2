output "endpoint" {
  description = "S3 endpoint URL for clients (the internal NLB)."
  value       = "http://${aws_lb.larder.dns_name}:9000"
}

output "security_group_id" {
  description = "Security group of the Larder instances."
  value       = aws_security_group.larder.id
}

output "role_arn" {
  description = "IAM role of the instances."
  value       = aws_iam_role.larder.arn
}

output "log_group" {
  description = "CloudWatch log group with Larder's JSON logs."
  value       = aws_cloudwatch_log_group.larder.name
}
