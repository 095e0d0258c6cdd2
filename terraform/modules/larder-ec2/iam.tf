data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

locals {
  all_buckets = distinct(concat(var.read_buckets, var.write_buckets))
}

data "aws_iam_policy_document" "larder" {
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
