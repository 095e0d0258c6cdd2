data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

module "s3_policy" {
  source        = "../larder-s3-policy"
  read_buckets  = var.read_buckets
  write_buckets = var.write_buckets

  events_queue_arn = var.events_queue_arn
}

data "aws_iam_policy_document" "larder" {
  source_policy_documents = [module.s3_policy.json]
  statement {
    sid       = "ClientKeys"
    actions   = ["ssm:GetParameter"]
    resources = ["arn:aws:ssm:*:*:parameter/${trimprefix(var.client_keys_parameter, "/")}"]
  }
  dynamic "statement" {
    for_each = startswith(var.larder_binary_url, "s3://") ? [1] : []
    content {
      sid       = "Binary"
      actions   = ["s3:GetObject"]
      resources = ["arn:aws:s3:::${trimprefix(var.larder_binary_url, "s3://")}"]
    }
  }
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${aws_cloudwatch_log_group.larder.arn}:*"]
  }
}

resource "aws_iam_role" "larder" {
  name               = "${var.name}-instance"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "larder" {
  name   = "larder"
  role   = aws_iam_role.larder.id
  policy = data.aws_iam_policy_document.larder.json
}

# Session Manager instead of SSH: no inbound port 22, access through IAM.
resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.larder.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "larder" {
  name = "${var.name}-instance"
  role = aws_iam_role.larder.name
}
