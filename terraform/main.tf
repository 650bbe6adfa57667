# spotswarm on AWS: one on-demand orchestrator (API, DHT peer, PostgreSQL), spot workers launched by it
# from the worker launch template, and an S3 bucket for checkpoints. Files: network.tf, security.tf,
# storage.tf, iam.tf, orchestrator.tf, workers.tf.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  # Two tag keys that never meet. The module's own resources (the orchestrator's instance included)
  # carry spotswarm:deployment=<name>. Workers carry spotswarm:orchestrator=<deployment id> plus a
  # request id, both set by the EC2 launcher at launch; the orchestrator may terminate nothing else
  # (iam.tf), so it can never mistake itself, or anything else of the module, for a worker. The
  # deployment id is unique to this deployment (below): two deployments with the same name in one
  # account and region never see, let alone terminate, each other's workers.
  tag_deployment   = "spotswarm:deployment"
  tag_orchestrator = "spotswarm:orchestrator"
  tag_request      = "spotswarm:request-id"
  tags             = merge(var.tags, { (local.tag_deployment) = var.name })
  deployment_id    = terraform_data.deployment_id.output

  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  ec2_arn    = "arn:${local.partition}:ec2:${local.region}:${local.account_id}"

  bucket_name = coalesce(var.checkpoint_bucket_name, "${var.name}-checkpoints-${local.account_id}")

  # The cloud-init templates live with the images they start (deploy/), shared with the EC2 launcher.
  deploy_dir = "${path.module}/../deploy"
}

# The value of the spotswarm:orchestrator tag on this deployment's workers: its name and 12 random hex
# digits, made at the first apply and then kept (a new value would disown the workers running).
resource "terraform_data" "deployment_id" {
  input = "${var.name}-${substr(sha256(uuid()), 0, 12)}"

  lifecycle {
    ignore_changes = [input]
  }
}
