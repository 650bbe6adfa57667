# Least privilege. The orchestrator may launch instances only from the worker launch template (the
# request must name it: ec2:LaunchTemplate), only with the worker AMI, only of the worker instance
# types, only with IMDSv2 required, only tagged spotswarm:orchestrator=<deployment id> (unique to this
# deployment: main.tf) and with a request id, and terminate only instances carrying both (no resource
# of the module does); it may pass the worker role and nothing else. Workers never touch AWS APIs (all their checkpoint traffic goes through the
# orchestrator's API): they may only pull from ECR, when configured. Policies are plain
# jsonencode() documents so the plan tests can read them.

locals {
  checkpoint_objects = "${aws_s3_bucket.checkpoints.arn}/${var.checkpoint_prefix}/*"
  worker_ami_arn     = "arn:${local.partition}:ec2:${local.region}::image/${local.worker_ami_id}"

  ec2_assume_role = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })

  checkpoint_statements = [
    {
      Sid      = "CheckpointObjects"
      Effect   = "Allow"
      Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
      Resource = [local.checkpoint_objects]
    },
    {
      Sid       = "CheckpointListing"
      Effect    = "Allow"
      Action    = ["s3:ListBucket"]
      Resource  = [aws_s3_bucket.checkpoints.arn]
      Condition = { StringLike = { "s3:prefix" = ["${var.checkpoint_prefix}/*"] } }
    },
  ]

  kms_statements = var.kms_key_arn == null ? [] : [{
    Sid      = "CheckpointKey"
    Effect   = "Allow"
    Action   = ["kms:Decrypt", "kms:GenerateDataKey"]
    Resource = [var.kms_key_arn]
  }]

  orchestrator_policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat([
      {
        Sid      = "LaunchOnlyTaggedWorkers"
        Effect   = "Allow"
        Action   = ["ec2:CreateFleet", "ec2:RunInstances"]
        Resource = ["${local.ec2_arn}:fleet/*"]
        Condition = {
          StringEquals = { "aws:RequestTag/${local.tag_orchestrator}" = local.deployment_id }
          Null         = { "aws:RequestTag/${local.tag_request}" = "false" }
        }
      },
      {
        # The instances themselves: tagged as above, and only as the worker launch template makes them
        # (its ARN named in the request), of the worker instance types, with IMDSv2 required.
        Sid      = "LaunchOnlyWorkerInstances"
        Effect   = "Allow"
        Action   = ["ec2:CreateFleet", "ec2:RunInstances"]
        Resource = ["${local.ec2_arn}:instance/*"]
        Condition = {
          StringEquals = {
            "aws:RequestTag/${local.tag_orchestrator}" = local.deployment_id
            "ec2:InstanceType"                         = var.worker_instance_types
            "ec2:MetadataHttpTokens"                   = "required"
          }
          ArnEquals = { "ec2:LaunchTemplate" = aws_launch_template.worker.arn }
          Null      = { "aws:RequestTag/${local.tag_request}" = "false" }
        }
      },
      {
        Sid    = "LaunchFromWorkerTemplateAndAmi"
        Effect = "Allow"
        Action = ["ec2:CreateFleet", "ec2:RunInstances"]
        Resource = [
          aws_launch_template.worker.arn,
          local.worker_ami_arn,
          "${local.ec2_arn}:subnet/*",
          "${local.ec2_arn}:security-group/${aws_security_group.workers.id}",
          "${local.ec2_arn}:network-interface/*",
          "${local.ec2_arn}:volume/*",
          "${local.ec2_arn}:spot-instances-request/*",
        ]
      },
      {
        Sid      = "TagOnlyWhileLaunching"
        Effect   = "Allow"
        Action   = ["ec2:CreateTags"]
        Resource = ["${local.ec2_arn}:instance/*", "${local.ec2_arn}:fleet/*", "${local.ec2_arn}:volume/*", "${local.ec2_arn}:spot-instances-request/*"]
        Condition = {
          StringEquals = { "ec2:CreateAction" = ["CreateFleet", "RunInstances"] }
        }
      },
      {
        Sid      = "TerminateOnlyOwnWorkers"
        Effect   = "Allow"
        Action   = ["ec2:TerminateInstances"]
        Resource = ["${local.ec2_arn}:instance/*"]
        Condition = {
          StringEquals = { "ec2:ResourceTag/${local.tag_orchestrator}" = local.deployment_id }
          Null         = { "ec2:ResourceTag/${local.tag_request}" = "false" }
        }
      },
      {
        # Describe calls support no resource-level permissions.
        Sid    = "Observe"
        Effect = "Allow"
        Action = [
          "ec2:DescribeInstances", "ec2:DescribeSpotPriceHistory", "ec2:DescribeLaunchTemplates",
          "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeFleets", "ec2:DescribeFleetInstances",
          "ec2:DescribeSubnets", "ec2:DescribeInstanceTypes", "ec2:DescribeAvailabilityZones",
          "ec2:DescribeImages",
        ]
        Resource = ["*"]
      },
      {
        Sid       = "PassOnlyTheWorkerRole"
        Effect    = "Allow"
        Action    = ["iam:PassRole"]
        Resource  = [aws_iam_role.worker.arn]
        Condition = { StringEquals = { "iam:PassedToService" = "ec2.amazonaws.com" } }
      },
      {
        # EC2 Fleet and spot need their service-linked roles; created on first use if missing.
        Sid       = "FleetServiceLinkedRoles"
        Effect    = "Allow"
        Action    = ["iam:CreateServiceLinkedRole"]
        Resource  = ["*"]
        Condition = { StringEquals = { "iam:AWSServiceName" = ["ec2fleet.amazonaws.com", "spot.amazonaws.com"] } }
      },
    ], local.checkpoint_statements, local.kms_statements, local.ecr_statements)
  })

  ecr_statements = length(var.ecr_repository_arns) == 0 ? [] : [
    {
      Sid      = "PullWorkerImage"
      Effect   = "Allow"
      Action   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
      Resource = var.ecr_repository_arns
    },
    {
      Sid      = "EcrLogin"
      Effect   = "Allow"
      Action   = ["ecr:GetAuthorizationToken"]
      Resource = ["*"]
    },
  ]

  # Pulling the worker image from ECR is all a worker may do; without ECR repositories the role has no
  # policy at all, so the credentials user code can read from the metadata service allow nothing.
  worker_policy = length(local.ecr_statements) == 0 ? null : jsonencode({
    Version   = "2012-10-17"
    Statement = local.ecr_statements
  })
}

resource "aws_iam_role" "orchestrator" {
  name_prefix        = "${var.name}-orch-"
  description        = "spotswarm orchestrator: launches and terminates its spot workers"
  assume_role_policy = local.ec2_assume_role
  tags               = local.tags
}

resource "aws_iam_role_policy" "orchestrator" {
  name   = "spotswarm-orchestrator"
  role   = aws_iam_role.orchestrator.id
  policy = local.orchestrator_policy
}

resource "aws_iam_role_policy_attachment" "orchestrator_ssm" {
  count      = var.enable_ssm_session ? 1 : 0
  role       = aws_iam_role.orchestrator.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "orchestrator" {
  name_prefix = "${var.name}-orch-"
  role        = aws_iam_role.orchestrator.name
  tags        = local.tags
}

resource "aws_iam_role" "worker" {
  name_prefix        = "${var.name}-worker-"
  description        = "spotswarm worker: pulls its image, nothing else"
  assume_role_policy = local.ec2_assume_role
  tags               = local.tags
}

resource "aws_iam_role_policy" "worker" {
  count  = local.worker_policy == null ? 0 : 1
  name   = "spotswarm-worker"
  role   = aws_iam_role.worker.id
  policy = local.worker_policy
}

resource "aws_iam_instance_profile" "worker" {
  name_prefix = "${var.name}-worker-"
  role        = aws_iam_role.worker.name
  tags        = local.tags
}
