# Either a new VPC with one public subnet per zone (no NAT gateway to pay for: instances get public
# IPs, and the security groups admit only what spotswarm needs), or an existing VPC and its subnets.

locals {
  create_vpc = var.vpc_id == null
  azs        = local.create_vpc ? slice(data.aws_availability_zones.available[0].names, 0, min(var.az_count, length(data.aws_availability_zones.available[0].names))) : []
  vpc_id     = local.create_vpc ? aws_vpc.this[0].id : var.vpc_id
  subnet_ids = local.create_vpc ? aws_subnet.public[*].id : var.subnet_ids
  # The orchestrator's zone: its data volume must stay in it across instance replacements.
  orchestrator_az = local.create_vpc ? aws_subnet.public[0].availability_zone : data.aws_subnet.orchestrator[0].availability_zone
}

data "aws_availability_zones" "available" {
  count = local.create_vpc ? 1 : 0
  state = "available"

  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

data "aws_subnet" "orchestrator" {
  count = local.create_vpc ? 0 : 1
  id    = var.subnet_ids[0]
}

resource "aws_vpc" "this" {
  count = local.create_vpc ? 1 : 0

  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = merge(local.tags, { Name = var.name })
}

resource "aws_internet_gateway" "this" {
  count = local.create_vpc ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = merge(local.tags, { Name = var.name })
}

resource "aws_subnet" "public" {
  count = length(local.azs)

  vpc_id                  = aws_vpc.this[0].id
  availability_zone       = local.azs[count.index]
  cidr_block              = cidrsubnet(var.vpc_cidr, 4, count.index)
  map_public_ip_on_launch = true
  tags                    = merge(local.tags, { Name = "${var.name}-public-${local.azs[count.index]}" })
}

resource "aws_route_table" "public" {
  count = local.create_vpc ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = merge(local.tags, { Name = "${var.name}-public" })

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }
}

resource "aws_route_table_association" "public" {
  count = length(local.azs)

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public[0].id
}
