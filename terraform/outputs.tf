output "orchestrator_url" {
  description = "The orchestrator's API and status page over HTTPS, for `spotswarm --url` (reachable from allowed_api_cidrs). Without domain_name its certificate is self-signed: see docs/guides/aws.md for trusting it."
  value       = "https://${local.domain_name != "" ? local.domain_name : local.orchestrator_address}"
}

output "orchestrator_public_ip" {
  description = "Address users reach the orchestrator at (point domain_name's A record here). It changes when the instance is stopped and started or replaced."
  value       = local.orchestrator_address
}

output "worker_api_url" {
  description = "The plain-HTTP API address workers use inside the VPC (SPOTSWARM_PUBLIC_URL on the orchestrator)."
  value       = "http://${aws_instance.orchestrator.private_ip}:${var.api_port}"
}

output "tls_fingerprint_command" {
  description = "Prints the SHA-256 fingerprint of the orchestrator's current TLS certificate, from the instance's console log (compare it with the certificate you saved)."
  value       = "aws ec2 get-console-output --instance-id ${aws_instance.orchestrator.id} --latest --output text | grep spotswarm-tls"
}

output "orchestrator_instance_id" {
  description = "Instance id of the orchestrator (for `aws ssm start-session --target`)."
  value       = aws_instance.orchestrator.id
}

output "worker_launch_template_id" {
  description = "Launch template the EC2 launcher starts workers from (launcher option launch_template)."
  value       = aws_launch_template.worker.id
}

output "subnet_ids" {
  description = "Subnets workers may use (launcher option subnet_ids)."
  value       = local.subnet_ids
}

output "vpc_id" {
  description = "The VPC everything runs in."
  value       = local.vpc_id
}

output "checkpoint_bucket" {
  description = "S3 bucket of the checkpoints."
  value       = aws_s3_bucket.checkpoints.id
}

output "checkpoint_prefix" {
  description = "Key prefix of the checkpoints in the bucket."
  value       = var.checkpoint_prefix
}

output "orchestrator_role_arn" {
  description = "IAM role of the orchestrator."
  value       = aws_iam_role.orchestrator.arn
}

output "worker_role_arn" {
  description = "IAM role of the workers."
  value       = aws_iam_role.worker.arn
}

output "security_group_ids" {
  description = "Security groups of the orchestrator and of the workers."
  value       = { orchestrator = aws_security_group.orchestrator.id, workers = aws_security_group.workers.id }
}

output "deployment_id" {
  description = "The value of the spotswarm:orchestrator tag on this deployment's workers: its name and a random suffix, made at the first apply, so no other deployment (the same name included) can see or terminate them."
  value       = local.deployment_id
}
