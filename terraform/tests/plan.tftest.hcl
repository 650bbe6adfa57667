# Offline tests of the module: a mocked AWS provider, so `apply` here creates nothing and needs no
# credentials. They check what a reviewer would check in a plan: tags, who may reach which port, and
# how far the IAM policies reach.

mock_provider "aws" {
  override_data {
    target = data.aws_availability_zones.available
    values = { names = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"] }
  }
  override_data {
    target = data.aws_caller_identity.current
    values = { account_id = "123456789012" }
  }
  override_data {
    target = data.aws_region.current
    values = { name = "us-east-1" }
  }
  override_data {
    target = data.aws_partition.current
    values = { partition = "aws" }
  }
  override_data {
    target = data.aws_ssm_parameter.worker_ami
    values = { value = "ami-0123456789abcdef0" }
  }
  override_data {
    target = data.aws_ssm_parameter.al2023
    values = { value = "ami-0fedcba9876543210" }
  }
  override_data {
    target = data.aws_subnet.orchestrator
    values = { availability_zone = "eu-west-1b" }
  }
  mock_resource "aws_launch_template" {
    defaults = {
      id  = "lt-0123456789abcdef0"
      arn = "arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0123456789abcdef0"
    }
  }
  mock_resource "aws_s3_bucket" {
    defaults = { arn = "arn:aws:s3:::spotswarm-checkpoints-123456789012" }
  }
  mock_resource "aws_iam_instance_profile" {
    defaults = { arn = "arn:aws:iam::123456789012:instance-profile/spotswarm-worker-mock" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/spotswarm-worker-mock" }
  }
  mock_resource "aws_subnet" {
    defaults = { availability_zone = "us-east-1a" }
  }
}

variables {
  allowed_api_cidrs  = ["203.0.113.7/32"]
  orchestrator_image = "registry.example/spotswarm-orchestrator:0.1.0"
  worker_image       = "registry.example/spotswarm-worker:0.1.0"
}

run "new_vpc_spans_zones_and_tags_everything" {
  command = apply

  assert {
    condition     = length(aws_vpc.this) == 1 && length(aws_subnet.public) == 3
    error_message = "a new VPC with one public subnet in each of az_count zones"
  }
  assert {
    condition     = [for s in aws_subnet.public : s.availability_zone] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    error_message = "subnets spread over distinct zones"
  }
  assert {
    condition = alltrue([
      for tags in [aws_instance.orchestrator.tags, aws_instance.orchestrator.volume_tags, aws_s3_bucket.checkpoints.tags,
        aws_launch_template.worker.tags, aws_launch_template.worker.tag_specifications[0].tags,
      aws_security_group.workers.tags, aws_iam_role.orchestrator.tags, aws_ebs_volume.orchestrator_data.tags] :
      tags["spotswarm:deployment"] == "spotswarm" && !contains(keys(tags), "spotswarm:orchestrator") && !contains(keys(tags), "spotswarm:request-id")
    ])
    error_message = "every resource carries spotswarm:deployment=<name>, none a worker's tags (spotswarm:orchestrator, spotswarm:request-id)"
  }
  assert {
    condition     = aws_ebs_volume.orchestrator_data.availability_zone == aws_subnet.public[0].availability_zone && aws_ebs_volume.orchestrator_data.encrypted
    error_message = "the data volume is encrypted and pinned to the orchestrator subnet's zone"
  }
  assert {
    condition     = aws_instance.orchestrator.metadata_options[0].http_tokens == "required"
    error_message = "the orchestrator allows IMDSv2 only"
  }
}

run "api_open_only_to_allowed_cidrs_and_dht_only_between_peers" {
  command = apply

  assert {
    condition     = [for r in values(aws_vpc_security_group_ingress_rule.api_from_allowed) : r.cidr_ipv4] == ["203.0.113.7/32"]
    error_message = "the API accepts the allowed CIDRs, nothing else from outside"
  }
  assert {
    condition = alltrue([for r in [
      aws_vpc_security_group_ingress_rule.api_from_workers, aws_vpc_security_group_ingress_rule.dht_from_workers,
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers,
    aws_vpc_security_group_ingress_rule.worker_dht_from_orchestrator] : r.cidr_ipv4 == null && r.referenced_security_group_id != null])
    error_message = "DHT and worker API rules admit security groups, never address ranges"
  }
  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.dht_from_workers.from_port == 31330 &&
      aws_vpc_security_group_ingress_rule.dht_from_workers.to_port == 31330 &&
      aws_vpc_security_group_ingress_rule.dht_from_workers.security_group_id == aws_security_group.orchestrator.id &&
      aws_vpc_security_group_ingress_rule.dht_from_workers.referenced_security_group_id == aws_security_group.workers.id
    )
    error_message = "the orchestrator's DHT port is open to workers only"
  }
  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers.security_group_id == aws_security_group.workers.id &&
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers.referenced_security_group_id == aws_security_group.workers.id &&
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers.from_port == 31331 &&
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers.to_port == 31338 &&
      aws_vpc_security_group_ingress_rule.worker_dht_from_orchestrator.from_port == 31331 &&
      aws_vpc_security_group_ingress_rule.worker_dht_from_orchestrator.to_port == 31338
    )
    error_message = "workers reach each other's DHT ports, one per peer of an instance of up to 8 GPUs"
  }
  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.api_from_allowed["203.0.113.7/32"].from_port == 443 &&
      aws_vpc_security_group_ingress_rule.api_from_allowed["203.0.113.7/32"].to_port == 443
    )
    error_message = "allowed networks reach HTTPS (nginx), nothing else"
  }
  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.api_from_workers.from_port == 8000 &&
      aws_vpc_security_group_ingress_rule.api_from_workers.referenced_security_group_id == aws_security_group.workers.id
    )
    error_message = "the plain-HTTP API port is open to the worker security group only"
  }
  assert {
    condition     = length(aws_vpc_security_group_ingress_rule.acme_http_challenge) == 0
    error_message = "without a domain, port 80 stays closed"
  }
}

run "nginx_terminates_tls_in_front_of_an_orchestrator_on_loopback" {
  command = apply

  assert {
    condition = alltrue([
      local.orchestrator_env.SPOTSWARM_HOST == "127.0.0.1",
      local.orchestrator_env.SPOTSWARM_TLS_PROXY == "true",
      local.orchestrator_env.SPOTSWARM_PORT == "8001",
    ])
    error_message = "the orchestrator listens on loopback only and knows a TLS proxy is in front"
  }
  assert {
    condition = alltrue([
      strcontains(local.nginx_conf, "listen 443 ssl;"),
      strcontains(local.nginx_conf, "listen 8000;"),
      strcontains(local.nginx_conf, "server 127.0.0.1:8001;"),
      strcontains(local.nginx_conf, "limit_conn per_client 32;"),
      strcontains(local.nginx_conf, "client_max_body_size 4294967296;"),
      !strcontains(local.nginx_conf, "acme-challenge"),
    ])
    error_message = "nginx: HTTPS for users, plain HTTP for workers, the per-client limit, no ACME server without a domain"
  }
  assert {
    condition = alltrue([
      strcontains(local.nginx_conf, "client_max_body_size 1073741824;"),
      local.orchestrator_env.SPOTSWARM_PACKAGE_MAX_BYTES == "1073741824",
      strcontains(local.nginx_conf, "add_header Strict-Transport-Security $spotswarm_hsts always;"),
      strcontains(local.nginx_conf, "listen 443 ssl default_server;"),
      strcontains(local.nginx_conf, "return 444;"),
      local.orchestrator_env.SPOTSWARM_TRUSTED_HOSTS == "",
    ])
    error_message = "nginx lets code packages as large as the orchestrator takes through, sends HSTS, and drops requests for unknown hosts"
  }
  assert {
    condition = alltrue([
      strcontains(local.orchestrator_user_data, base64encode(local.nginx_conf)),
      strcontains(local.orchestrator_user_data, "nginx:1.28.0-alpine"),
      !strcontains(local.orchestrator_user_data, "spotswarm-certbot.timer]"),
    ])
    error_message = "the instance boots nginx with that configuration, and no certbot without a domain"
  }
  assert {
    condition     = startswith(output.orchestrator_url, "https://") && !strcontains(output.orchestrator_url, ":8000")
    error_message = "users are given the HTTPS address"
  }
}

run "a_domain_gets_lets_encrypt_over_port_80" {
  command = apply

  variables {
    domain_name = "spotswarm.example.com"
  }

  assert {
    condition     = output.orchestrator_url == "https://spotswarm.example.com"
    error_message = "users are given the domain"
  }
  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.acme_http_challenge[0].from_port == 80 &&
      aws_vpc_security_group_ingress_rule.acme_http_challenge[0].cidr_ipv4 == "0.0.0.0/0"
    )
    error_message = "Let's Encrypt reaches port 80 from anywhere"
  }
  assert {
    condition = alltrue([for r in concat(values(aws_vpc_security_group_ingress_rule.api_from_allowed), aws_vpc_security_group_ingress_rule.acme_http_challenge, [
      aws_vpc_security_group_ingress_rule.api_from_workers, aws_vpc_security_group_ingress_rule.dht_from_workers,
      aws_vpc_security_group_ingress_rule.worker_dht_from_workers, aws_vpc_security_group_ingress_rule.worker_dht_from_orchestrator,
    ]) : can(regex("^[a-zA-Z0-9. _:/()#,@+=&;{}!$*\\[\\]-]*$", r.description))])
    error_message = "rule descriptions use only the characters EC2 accepts (no apostrophes)"
  }
  assert {
    condition = alltrue([
      strcontains(local.nginx_conf, "listen 80;"),
      strcontains(local.nginx_conf, "location /.well-known/acme-challenge/"),
      strcontains(local.orchestrator_user_data, "spotswarm-certbot.timer]"),
      strcontains(local.orchestrator_user_data, "-d \"$domain\""),
    ])
    error_message = "nginx serves the challenge and certbot runs on a timer"
  }
  assert {
    condition = alltrue([
      local.orchestrator_env.SPOTSWARM_TRUSTED_HOSTS == "spotswarm.example.com",
      strcontains(local.nginx_conf, "server_name spotswarm.example.com;"),
      strcontains(local.nginx_conf, "listen 80 default_server;"),
      strcontains(local.nginx_conf, "return 301 https://spotswarm.example.com$request_uri;"),
    ])
    error_message = "the domain is the name served (by nginx and the orchestrator); port 80 redirects to it and drops other names"
  }
}

run "rejects_an_api_open_to_the_internet_without_opting_in" {
  command = plan

  variables {
    allowed_api_cidrs = ["0.0.0.0/0"]
  }

  expect_failures = [var.allowed_api_cidrs]
}

run "accepts_an_api_open_to_the_internet_when_opted_in" {
  command = plan

  variables {
    allowed_api_cidrs       = ["0.0.0.0/0"]
    allow_api_from_anywhere = true
  }

  assert {
    condition     = [for r in values(aws_vpc_security_group_ingress_rule.api_from_allowed) : r.cidr_ipv4] == ["0.0.0.0/0"]
    error_message = "the opt-in is honoured"
  }
}

run "orchestrator_iam_is_scoped_to_its_tag_template_and_worker_role" {
  command = apply

  assert {
    condition     = can(regex("^spotswarm-[0-9a-f]{12}$", output.deployment_id))
    error_message = "the workers' tag value is the deployment's name and a random suffix, never the name alone"
  }
  assert {
    condition     = local.orchestrator_env.SPOTSWARM_EC2_ORCHESTRATOR_ID == output.deployment_id
    error_message = "the EC2 launcher tags workers with the deployment id the policy names"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyTaggedWorkers"]).Condition.StringEquals["aws:RequestTag/spotswarm:orchestrator"] == output.deployment_id
    error_message = "fleets may only be created carrying the deployment's own tag value"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyWorkerInstances"]).Condition.StringEquals["aws:RequestTag/spotswarm:orchestrator"] == output.deployment_id
    error_message = "instances may only be created carrying the deployment's own tag value"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyWorkerInstances"]).Condition.Null["aws:RequestTag/spotswarm:request-id"] == "false"
    error_message = "instances may only be created carrying a request id"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyWorkerInstances"]).Condition.ArnEquals["ec2:LaunchTemplate"] == aws_launch_template.worker.arn
    error_message = "instances may only be launched from the worker launch template (the request must name it)"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyWorkerInstances"]).Condition.StringEquals["ec2:InstanceType"] == ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]
    error_message = "instances may only be of the worker instance types"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyWorkerInstances"]).Condition.StringEquals["ec2:MetadataHttpTokens"] == "required"
    error_message = "instances may only be launched with IMDSv2 required"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement :
      s.Sid == "LaunchOnlyWorkerInstances" if contains(s.Resource, "arn:aws:ec2:us-east-1:123456789012:instance/*") && anytrue([for a in s.Action : contains(["ec2:RunInstances", "ec2:CreateFleet"], a)])
    ])
    error_message = "no other statement allows launching an instance"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchOnlyTaggedWorkers"]).Condition.Null["aws:RequestTag/spotswarm:request-id"] == "false"
    error_message = "instances and fleets may only be created carrying a request id"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "TerminateOnlyOwnWorkers"]).Condition.StringEquals["ec2:ResourceTag/spotswarm:orchestrator"] == output.deployment_id
    error_message = "only instances carrying the deployment's own tag value may be terminated (not another deployment's of the same name)"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "TerminateOnlyOwnWorkers"]).Condition.Null["ec2:ResourceTag/spotswarm:request-id"] == "false"
    error_message = "only instances carrying a request id (launched workers) may be terminated"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement :
      s.Sid == "TerminateOnlyOwnWorkers" if contains(s.Action, "ec2:TerminateInstances")
    ])
    error_message = "no other statement allows terminating instances"
  }
  assert {
    condition = alltrue([
      contains(one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchFromWorkerTemplateAndAmi"]).Resource, aws_launch_template.worker.arn),
      contains(one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchFromWorkerTemplateAndAmi"]).Resource, "arn:aws:ec2:us-east-1::image/ami-0123456789abcdef0"),
      length([for r in one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "LaunchFromWorkerTemplateAndAmi"]).Resource : r if strcontains(r, "launch-template") || strcontains(r, ":image/")]) == 2,
    ])
    error_message = "launches may use the worker launch template and the worker AMI only"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "PassOnlyTheWorkerRole"]).Resource == [aws_iam_role.worker.arn]
    error_message = "iam:PassRole is limited to the worker role"
  }
  assert {
    condition = alltrue(flatten([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : [
      for a in s.Action : !endswith(a, ":*") && a != "*"
    ]]))
    error_message = "no wildcard actions"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement :
      contains(["Observe", "FleetServiceLinkedRoles", "EcrLogin"], s.Sid) if contains(s.Resource, "*")
    ])
    error_message = "Resource '*' only for describe calls and conditioned service-linked roles"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement :
      s.Condition != null if anytrue([for a in s.Action : contains(["ec2:CreateTags", "ec2:TerminateInstances", "iam:PassRole", "iam:CreateServiceLinkedRole"], a)])
    ])
    error_message = "tagging, terminating and role actions always carry a condition"
  }
}

run "the_workers_tag_value_is_kept_across_applies" {
  command = apply

  assert {
    condition     = output.deployment_id == run.orchestrator_iam_is_scoped_to_its_tag_template_and_worker_role.deployment_id
    error_message = "a later apply keeps the deployment id: a new one would disown the running workers"
  }
}

run "workers_get_no_aws_permissions" {
  command = apply

  assert {
    condition     = length(aws_iam_role_policy.worker) == 0
    error_message = "without ECR repositories the worker role has no policy: workers never call AWS (checkpoints go through the API)"
  }
}

run "workers_may_only_pull_their_image_from_ecr" {
  command = apply

  variables {
    ecr_repository_arns = ["arn:aws:ecr:us-east-1:123456789012:repository/spotswarm-worker"]
    kms_key_arn         = "arn:aws:kms:us-east-1:123456789012:key/0b3d9f4e-0000-4000-8000-000000000000"
  }

  assert {
    condition = alltrue(flatten([for s in jsondecode(aws_iam_role_policy.worker[0].policy).Statement : [
      for a in s.Action : startswith(a, "ecr:")
    ]]))
    error_message = "workers get ECR pulls only: no S3, no KMS, no EC2, no IAM"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.worker[0].policy).Statement : s if s.Sid == "PullWorkerImage"]).Resource == ["arn:aws:ecr:us-east-1:123456789012:repository/spotswarm-worker"]
    error_message = "image pulls are limited to the given repositories"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.orchestrator.policy).Statement : s if s.Sid == "CheckpointObjects"]).Resource == ["arn:aws:s3:::spotswarm-checkpoints-123456789012/spotswarm/*"]
    error_message = "the orchestrator alone reaches the checkpoint prefix"
  }
}

run "checkpoint_bucket_is_private_encrypted_versioned" {
  command = apply

  assert {
    condition = alltrue([
      aws_s3_bucket_public_access_block.checkpoints.block_public_acls,
      aws_s3_bucket_public_access_block.checkpoints.block_public_policy,
      aws_s3_bucket_public_access_block.checkpoints.ignore_public_acls,
      aws_s3_bucket_public_access_block.checkpoints.restrict_public_buckets,
    ])
    error_message = "all public access is blocked"
  }
  assert {
    condition     = one(one(aws_s3_bucket_server_side_encryption_configuration.checkpoints.rule).apply_server_side_encryption_by_default).sse_algorithm == "AES256"
    error_message = "SSE-S3 by default"
  }
  assert {
    condition     = aws_s3_bucket_versioning.checkpoints.versioning_configuration[0].status == "Enabled"
    error_message = "versioning is on"
  }
  assert {
    condition     = aws_s3_bucket_lifecycle_configuration.checkpoints.rule[0].noncurrent_version_expiration[0].noncurrent_days == 7
    error_message = "old versions expire"
  }
  assert {
    condition     = aws_s3_bucket.checkpoints.bucket == "spotswarm-checkpoints-123456789012"
    error_message = "default bucket name carries the account id"
  }
}

run "worker_launch_template_boots_the_worker_image_and_terminates_on_poweroff" {
  command = apply

  assert {
    condition     = strcontains(base64decode(aws_launch_template.worker.user_data), "ExecStart=/usr/local/bin/spotswarm-worker-start registry.example/spotswarm-worker:0.1.0 all")
    error_message = "the launch template's user data starts the worker image with GPUs"
  }
  assert {
    condition     = startswith(base64decode(aws_launch_template.worker.user_data), "#cloud-config")
    error_message = "the user data is cloud-config"
  }
  assert {
    condition = (
      aws_launch_template.worker.instance_initiated_shutdown_behavior == "terminate" &&
      aws_launch_template.worker.metadata_options[0].http_tokens == "required" &&
      aws_launch_template.worker.metadata_options[0].http_put_response_hop_limit == 2 &&
      aws_launch_template.worker.image_id == "ami-0123456789abcdef0" &&
      aws_launch_template.worker.instance_type == "g5.xlarge"
    )
    error_message = "IMDSv2 with 2 hops, terminate on power-off, the worker AMI and first instance type"
  }
  assert {
    condition     = aws_launch_template.worker.vpc_security_group_ids == toset([aws_security_group.workers.id])
    error_message = "workers sit in the worker security group"
  }
}

run "existing_vpc_is_used_as_given" {
  command = apply

  variables {
    vpc_id     = "vpc-0123456789abcdef0"
    subnet_ids = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
  }

  assert {
    condition     = length(aws_vpc.this) == 0 && length(aws_subnet.public) == 0 && length(aws_internet_gateway.this) == 0
    error_message = "no network is created next to an existing VPC"
  }
  assert {
    condition     = aws_security_group.workers.vpc_id == "vpc-0123456789abcdef0" && aws_instance.orchestrator.subnet_id == "subnet-0123456789abcdef0"
    error_message = "security groups and the orchestrator land in the given VPC and first subnet"
  }
  assert {
    condition     = aws_ebs_volume.orchestrator_data.availability_zone == "eu-west-1b"
    error_message = "the data volume follows the given subnet's zone"
  }
  assert {
    condition     = output.subnet_ids == var.subnet_ids
    error_message = "workers may use every given subnet"
  }
}

run "rejects_an_api_open_to_nobody" {
  command = plan

  variables {
    allowed_api_cidrs = []
  }

  expect_failures = [var.allowed_api_cidrs]
}

run "rejects_latest_tags" {
  command = plan

  variables {
    worker_image = "registry.example/spotswarm-worker:latest"
  }

  expect_failures = [var.worker_image]
}

run "rejects_existing_vpc_without_subnets" {
  command = plan

  variables {
    vpc_id = "vpc-0123456789abcdef0"
  }

  expect_failures = [var.subnet_ids]
}
