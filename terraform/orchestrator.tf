# The orchestrator: one on-demand instance running three containers, the spotswarm API/reconciler/DHT
# peer (on 127.0.0.1 only), PostgreSQL, and nginx in front (HTTPS on 443 for users, plain HTTP on
# api_port for the workers in the VPC), keeping their state on a separate encrypted EBS volume that
# outlives the instance (replace the instance, keep the runs). Why not RDS, why nginx: docs/design/choices.md.

data "aws_ssm_parameter" "al2023" {
  count = var.orchestrator_ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

locals {
  # The module's tags, never a worker's (main.tf); tests tag a fake instance with exactly these.
  orchestrator_instance_tags = merge(local.tags, { Name = "${var.name}-orchestrator" })

  orchestrator_ami_id = var.orchestrator_ami_id != null ? var.orchestrator_ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)

  https_port  = 443
  domain_name = var.domain_name == null ? "" : var.domain_name
  # The orchestrator's own port, on 127.0.0.1 only: nginx is the one way in.
  app_port = 8001
  # The orchestrator's largest checkpoint upload; nginx lets uploads that large through.
  checkpoint_max_bytes = 4 * 1024 * 1024 * 1024
  # The orchestrator's largest code package (its default); nginx lets packages that large through.
  package_max_bytes = 1024 * 1024 * 1024

  # What the orchestrator container is told (SPOTSWARM_* settings); the private IP is added at boot.
  orchestrator_env = {
    SPOTSWARM_HOST                         = "127.0.0.1"
    SPOTSWARM_PORT                         = tostring(local.app_port)
    SPOTSWARM_TLS_PROXY                    = "true"
    SPOTSWARM_CHECKPOINT_MAX_BYTES         = tostring(local.checkpoint_max_bytes)
    SPOTSWARM_PACKAGE_MAX_BYTES            = tostring(local.package_max_bytes)
    SPOTSWARM_TRUSTED_HOSTS                = local.domain_name
    SPOTSWARM_DHT_PORT                     = tostring(var.dht_port)
    SPOTSWARM_DATA_DIR                     = "/data"
    SPOTSWARM_EC2_REGION                   = local.region
    SPOTSWARM_EC2_ORCHESTRATOR_ID          = local.deployment_id
    SPOTSWARM_EC2_LAUNCH_TEMPLATE          = aws_launch_template.worker.id
    SPOTSWARM_EC2_SUBNET_IDS               = join(",", local.subnet_ids)
    SPOTSWARM_EC2_INSTANCE_TYPES           = join(",", var.worker_instance_types)
    SPOTSWARM_EC2_WORKER_IMAGE             = var.worker_image
    SPOTSWARM_EC2_MAX_PRICE                = var.worker_max_price == null ? "" : var.worker_max_price
    SPOTSWARM_EC2_ON_DEMAND_FALLBACK_AFTER = var.on_demand_fallback_after == null ? "" : tostring(var.on_demand_fallback_after)
    SPOTSWARM_S3_BUCKET                    = aws_s3_bucket.checkpoints.id
    SPOTSWARM_S3_PREFIX                    = var.checkpoint_prefix
    AWS_REGION                             = local.region
  }

  nginx_conf = templatefile("${local.deploy_dir}/nginx/nginx.conf", {
    nginx_user                 = "nginx" # the official image's
    run_dir                    = "/var/cache/nginx"
    https_port                 = local.https_port
    worker_port                = var.api_port
    http_port                  = 80
    upstream_port              = local.app_port
    tls_dir                    = "/var/lib/spotswarm/tls"
    acme_dir                   = "/var/lib/spotswarm/acme"
    domain_name                = local.domain_name
    max_connections_per_client = var.proxy_max_connections_per_client
    checkpoint_max_bytes       = local.checkpoint_max_bytes
    package_max_bytes          = local.package_max_bytes
  })

  orchestrator_user_data = templatefile("${local.deploy_dir}/cloud-init/orchestrator.yaml", {
    orchestrator_image = var.orchestrator_image
    postgres_image     = var.postgres_image
    proxy_image        = var.proxy_image
    certbot_image      = var.certbot_image
    domain_name        = local.domain_name
    data_volume_id     = aws_ebs_volume.orchestrator_data.id
    api_port           = var.api_port
    dht_port           = var.dht_port
    nginx_conf_b64     = base64encode(local.nginx_conf)
    env_file_b64       = base64encode(join("", [for k in sort(keys(local.orchestrator_env)) : "${k}=${local.orchestrator_env[k]}\n"]))
  })
}

locals {
  orchestrator_address = aws_instance.orchestrator.public_ip != "" ? aws_instance.orchestrator.public_ip : aws_instance.orchestrator.private_ip
}

resource "aws_ebs_volume" "orchestrator_data" {
  availability_zone = local.orchestrator_az
  size              = var.orchestrator_data_volume_gb
  type              = "gp3"
  encrypted         = true
  tags              = merge(local.tags, { Name = "${var.name}-orchestrator-data" })
}

resource "aws_instance" "orchestrator" {
  ami                         = local.orchestrator_ami_id
  instance_type               = var.orchestrator_instance_type
  subnet_id                   = local.subnet_ids[0]
  vpc_security_group_ids      = [aws_security_group.orchestrator.id]
  iam_instance_profile        = aws_iam_instance_profile.orchestrator.name
  user_data_base64            = base64gzip(local.orchestrator_user_data)
  user_data_replace_on_change = true
  tags                        = local.orchestrator_instance_tags
  volume_tags                 = merge(local.tags, { Name = "${var.name}-orchestrator-root" })

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 2
  }

  root_block_device {
    volume_size = 30
    volume_type = "gp3"
    encrypted   = true
  }

  lifecycle {
    # A newer Amazon Linux AMI must not replace the running orchestrator on its own.
    ignore_changes = [ami]
  }
}

resource "aws_volume_attachment" "orchestrator_data" {
  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.orchestrator_data.id
  instance_id                    = aws_instance.orchestrator.id
  stop_instance_before_detaching = true
}
