# Who may talk to whom. HTTPS (443, nginx) is open to allowed_api_cidrs; the plain-HTTP API port (nginx
# again) and the orchestrator's DHT port only to the workers; the workers' DHT port only between workers
# and the orchestrator. Port 80 opens to everyone only with domain_name, for Let's Encrypt's HTTP-01
# challenge (nginx answers nothing else there but a redirect). No SSH: use Session Manager.

resource "aws_security_group" "orchestrator" {
  name_prefix = "${var.name}-orchestrator-"
  description = "spotswarm orchestrator: HTTP API and hivemind DHT"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-orchestrator" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "workers" {
  name_prefix = "${var.name}-workers-"
  description = "spotswarm workers: hivemind DHT and averaging between peers"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-workers" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "api_from_allowed" {
  for_each = toset(var.allowed_api_cidrs)

  security_group_id = aws_security_group.orchestrator.id
  description       = "HTTPS API from an allowed network"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.https_port
  to_port           = local.https_port
  tags              = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "acme_http_challenge" {
  count = local.domain_name == "" ? 0 : 1

  security_group_id = aws_security_group.orchestrator.id
  description       = "ACME HTTP-01 challenge of Lets Encrypt (nginx serves only the challenge and a redirect)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
  tags              = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "api_from_workers" {
  security_group_id            = aws_security_group.orchestrator.id
  description                  = "plain-HTTP API from workers (register, heartbeat, checkpoints)"
  referenced_security_group_id = aws_security_group.workers.id
  ip_protocol                  = "tcp"
  from_port                    = var.api_port
  to_port                      = var.api_port
  tags                         = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "dht_from_workers" {
  security_group_id            = aws_security_group.orchestrator.id
  description                  = "hivemind DHT from workers"
  referenced_security_group_id = aws_security_group.workers.id
  ip_protocol                  = "tcp"
  from_port                    = var.dht_port
  to_port                      = var.dht_port
  tags                         = local.tags
}

locals {
  # A worker instance runs one peer per GPU (the EC2 launcher's peers_per_machine, at most 8), the peer on
  # GPU i listening on worker_dht_port + i.
  worker_max_peers = 8
}

resource "aws_vpc_security_group_ingress_rule" "worker_dht_from_workers" {
  security_group_id            = aws_security_group.workers.id
  description                  = "hivemind DHT and averaging between workers"
  referenced_security_group_id = aws_security_group.workers.id
  ip_protocol                  = "tcp"
  from_port                    = var.worker_dht_port
  to_port                      = var.worker_dht_port + local.worker_max_peers - 1
  tags                         = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "worker_dht_from_orchestrator" {
  security_group_id            = aws_security_group.workers.id
  description                  = "hivemind DHT from the orchestrator peer"
  referenced_security_group_id = aws_security_group.orchestrator.id
  ip_protocol                  = "tcp"
  from_port                    = var.worker_dht_port
  to_port                      = var.worker_dht_port + local.worker_max_peers - 1
  tags                         = local.tags
}

# Outbound: image registries, the AWS APIs and S3. Kept open; restrict with VPC endpoints if needed.
resource "aws_vpc_security_group_egress_rule" "orchestrator_all" {
  security_group_id = aws_security_group.orchestrator.id
  description       = "all outbound"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
  tags              = local.tags
}

resource "aws_vpc_security_group_egress_rule" "workers_all" {
  security_group_id = aws_security_group.workers.id
  description       = "all outbound"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
  tags              = local.tags
}
