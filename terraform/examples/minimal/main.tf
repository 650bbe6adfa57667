# The smallest useful spotswarm deployment: a new VPC, the orchestrator, the worker launch template
# and the checkpoint bucket. `terraform apply -var 'my_ip_cidr=203.0.113.7/32'`, then see the outputs.

terraform {
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.100.0, < 6.0.0"
    }
  }
}

variable "region" {
  description = "AWS region to deploy to (pick one with several zones offering your GPU types)."
  type        = string
  default     = "us-east-1"
}

variable "my_ip_cidr" {
  description = "Your public address as a /32: the only network allowed to reach the API."
  type        = string

  validation {
    condition     = can(cidrhost(var.my_ip_cidr, 0))
    error_message = "my_ip_cidr must be a CIDR such as 203.0.113.7/32."
  }
}

variable "image_tag" {
  description = "Tag of the spotswarm images pushed to your registry."
  type        = string
  default     = "0.1.0"
}

variable "registry" {
  description = "Registry holding spotswarm-orchestrator and spotswarm-worker, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com."
  type        = string
}

provider "aws" {
  region = var.region

  default_tags {
    tags = { project = "spotswarm" }
  }
}

module "spotswarm" {
  source = "../.."

  name               = "spotswarm-demo"
  allowed_api_cidrs  = [var.my_ip_cidr]
  orchestrator_image = "${var.registry}/spotswarm-orchestrator:${var.image_tag}"
  worker_image       = "${var.registry}/spotswarm-worker:${var.image_tag}"

  worker_instance_types    = ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]
  on_demand_fallback_after = 5
  force_destroy_bucket     = true # a demo: `terraform destroy` may delete its checkpoints
}

output "orchestrator_url" {
  description = "Pass to `spotswarm --url` (HTTPS; trust its self-signed certificate with --ca-cert)."
  value       = module.spotswarm.orchestrator_url
}

output "orchestrator_instance_id" {
  description = "For `aws ssm start-session --target` (admin token, certificate)."
  value       = module.spotswarm.orchestrator_instance_id
}

output "tls_fingerprint_command" {
  description = "Prints the orchestrator certificate's SHA-256 fingerprint from the instance's console log."
  value       = module.spotswarm.tls_fingerprint_command
}

output "launcher_options" {
  description = "Launcher options for `spotswarm runs create --launcher ec2`."
  value = {
    launch_template = module.spotswarm.worker_launch_template_id
    subnet_ids      = module.spotswarm.subnet_ids
  }
}
