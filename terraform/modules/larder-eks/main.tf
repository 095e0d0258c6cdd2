locals {
  service_account = var.name
  oidc_host       = trimprefix(var.oidc_provider_url, "https://")
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_host}:sub"
      values   = ["system:serviceaccount:${var.namespace}:${local.service_account}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_host}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

# Least privilege: list and read the listed buckets; write only those in write_buckets.
module "s3_policy" {
  source        = "../larder-s3-policy"
  read_buckets  = var.read_buckets
  write_buckets = var.write_buckets

  events_queue_arn = var.events_queue_arn
}

resource "aws_iam_role" "larder" {
  name               = "${var.name}-larder"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "s3" {
  name   = "s3-access"
  role   = aws_iam_role.larder.id
  policy = module.s3_policy.json
}

resource "aws_vpc_endpoint" "s3" {
  count             = var.create_s3_gateway_endpoint ? 1 : 0
  vpc_id            = var.vpc_id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = var.route_table_ids
  tags              = merge(var.tags, { Name = "${var.name}-s3" })

  lifecycle {
    precondition {
      condition     = var.vpc_id != "" && length(var.route_table_ids) > 0
      error_message = "create_s3_gateway_endpoint needs vpc_id and route_table_ids."
    }
  }
}

resource "helm_release" "larder" {
  name             = var.name
  namespace        = var.namespace
  create_namespace = true
  chart            = var.chart_path
  wait             = true

  values = [
    yamlencode({
      replicaCount = var.replicas
      image        = { repository = var.image_repository, tag = var.image_tag }
      serviceAccount = {
        create      = true
        name        = local.service_account
        annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.larder.arn }
      }
      auth = { mode = "sigv4", existingSecret = var.client_keys_secret }
      disk = {
        enabled          = true
        type             = "persistentVolumeClaim"
        size             = var.disk_size
        capacity         = var.disk_capacity
        storageClassName = var.storage_class
      }
      config = merge({ upstream_region = var.region }, var.larder_config)
    }),
    yamlencode(var.chart_values),
  ]
}
