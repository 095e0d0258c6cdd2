data "aws_region" "current" {}

# The current Amazon Linux 2023 AMI.
data "aws_ssm_parameter" "al2023" {
  name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

resource "aws_cloudwatch_log_group" "larder" {
  #checkov:skip=CKV_AWS_338:Retention is a cost choice (log_retention_days); operational logs, not audit logs.
  #checkov:skip=CKV_AWS_158:Encrypted at rest by CloudWatch's own key unless log_kms_key_arn names a customer key.
  name              = "/larder/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

resource "aws_security_group" "larder" {
  name        = "${var.name}-instances"
  description = "Larder instances: S3 port from clients and the NLB, admin port from admins and health checks"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "s3_clients" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.larder.id
  description       = "S3 clients"
  ip_protocol       = "tcp"
  from_port         = 9000
  to_port           = 9000
  cidr_ipv4         = each.value
}

# The NLB preserves client addresses; its health checks come from its own addresses in the
# instances' subnets. Only those subnets reach the admin port for them, not the whole VPC.
data "aws_subnet" "larder" {
  for_each = toset(var.subnet_ids)
  id       = each.value
}

resource "aws_vpc_security_group_ingress_rule" "health" {
  for_each          = data.aws_subnet.larder
  security_group_id = aws_security_group.larder.id
  description       = "NLB health checks"
  ip_protocol       = "tcp"
  from_port         = 9001
  to_port           = 9001
  cidr_ipv4         = each.value.cidr_block
}

resource "aws_vpc_security_group_ingress_rule" "admin" {
  for_each          = toset(var.admin_cidrs)
  security_group_id = aws_security_group.larder.id
  description       = "Admin port"
  ip_protocol       = "tcp"
  from_port         = 9001
  to_port           = 9001
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.larder.id
  description       = "HTTPS to S3, SSM, CloudWatch"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_launch_template" "larder" {
  name_prefix   = "${var.name}-"
  image_id      = data.aws_ssm_parameter.al2023.value
  instance_type = var.instance_type
  user_data = base64encode(templatefile("${path.module}/user-data.sh.tftpl", {
    region                = data.aws_region.current.name
    larder_binary_url     = var.larder_binary_url
    client_keys_parameter = var.client_keys_parameter
    memory_capacity       = var.memory_capacity
    disk_capacity         = var.disk_capacity
    larder_config         = var.larder_config
    log_group             = aws_cloudwatch_log_group.larder.name
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.larder.arn
  }
  vpc_security_group_ids = [aws_security_group.larder.id]

  metadata_options {
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = var.name })
  }
  tags = var.tags
}

resource "aws_autoscaling_group" "larder" {
  name_prefix               = "${var.name}-"
  min_size                  = var.instance_count
  max_size                  = var.instance_count
  desired_capacity          = var.instance_count
  vpc_zone_identifier       = var.subnet_ids
  target_group_arns         = [aws_lb_target_group.s3.arn]
  health_check_type         = "ELB"
  health_check_grace_period = 120

  launch_template {
    id      = aws_launch_template.larder.id
    version = aws_launch_template.larder.latest_version
  }

  # Replace instances one at a time: each new one starts cold (instance store does not survive),
  # so keep most of the fleet's cache serving while it warms.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
    }
  }

  dynamic "tag" {
    for_each = merge(var.tags, { Name = var.name })
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}

resource "aws_lb" "larder" {
  #checkov:skip=CKV_AWS_152:Off on purpose: a client is served by Larder in its own zone, without cross-zone transfer charges.
  #checkov:skip=CKV_AWS_91:NLB access logs only cover TLS listeners; this one is TCP. Larder logs every failed request itself.
  name                             = var.name
  internal                         = true
  load_balancer_type               = "network"
  subnets                          = var.subnet_ids
  enable_cross_zone_load_balancing = false
  enable_deletion_protection       = var.deletion_protection
  tags                             = var.tags
}

resource "aws_lb_target_group" "s3" {
  name                 = "${var.name}-s3"
  port                 = 9000
  protocol             = "TCP"
  vpc_id               = var.vpc_id
  deregistration_delay = 60

  health_check {
    protocol = "HTTP"
    port     = "9001"
    path     = "/readyz"
  }
  tags = var.tags
}

resource "aws_lb_listener" "s3" {
  load_balancer_arn = aws_lb.larder.arn
  port              = 9000
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.s3.arn
  }
}
