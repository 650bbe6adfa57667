# The worker launch template. The orchestrator's EC2 launcher launches from it with one instant fleet
# per worker, overriding instance type and subnet, and passes each worker's own user data (join token,
# request id). The user data below is the same template rendered inert (no token): an instance started
# from the template by hand powers itself off.

data "aws_ssm_parameter" "worker_ami" {
  count = var.worker_ami_id == null ? 1 : 0
  name  = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
}

locals {
  worker_ami_id = var.worker_ami_id != null ? var.worker_ami_id : nonsensitive(data.aws_ssm_parameter.worker_ami[0].value)

  worker_user_data = templatefile("${local.deploy_dir}/cloud-init/worker.yaml", {
    worker_image   = var.worker_image
    worker_env_b64 = base64encode("SPOTSWARM_METADATA_URL=http://169.254.169.254\n")
    docker_gpus    = "all"
  })
}

resource "aws_launch_template" "worker" {
  name_prefix            = "${var.name}-worker-"
  description            = "spotswarm GPU worker (instance type, subnet and user data set per launch)"
  image_id               = local.worker_ami_id
  instance_type          = var.worker_instance_types[0]
  update_default_version = true
  user_data              = base64encode(local.worker_user_data)
  vpc_security_group_ids = [aws_security_group.workers.id]

  # The worker powers off when its agent exits; that must end the bill, not stop the machine.
  instance_initiated_shutdown_behavior = "terminate"

  iam_instance_profile {
    arn = aws_iam_instance_profile.worker.arn
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
    # 2 hops: the worker runs in a container and still reads spot notices from the metadata service.
    http_put_response_hop_limit = 2
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.worker_root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-worker" })
  }

  tags = local.tags
}
