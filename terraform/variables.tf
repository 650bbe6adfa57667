# Inputs of the spotswarm AWS module. Only `allowed_api_cidrs`, `orchestrator_image` and `worker_image`
# are required; everything else has a default that works in a fresh account.

variable "name" {
  description = "Prefix of every resource name; the value of the spotswarm:deployment tag on the module's resources, and the start of the spotswarm:orchestrator tag on the workers (followed by a random suffix unique to the deployment), which scopes the orchestrator's EC2 permissions."
  type        = string
  default     = "spotswarm"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.name))
    error_message = "name: 3-32 characters of lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "tags" {
  description = "Tags added to every resource (on top of the provider's default_tags)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.tags) : !startswith(k, "spotswarm:")])
    error_message = "tags: keys starting with 'spotswarm:' are reserved for the module."
  }
}

# --- Network ------------------------------------------------------------------------------------

variable "vpc_id" {
  description = "An existing VPC to use. Null: the module creates a VPC with one public subnet per zone."
  type        = string
  default     = null

  validation {
    condition     = var.vpc_id == null || can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Subnets of the existing VPC for the orchestrator (first one) and the workers (all, spread over zones). Required with vpc_id; they need a route to the internet (IGW or NAT) to pull images."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids must look like subnet-0123456789abcdef0."
  }

  validation {
    condition     = var.vpc_id == null || length(var.subnet_ids) > 0
    error_message = "With vpc_id set, subnet_ids must name at least one subnet of that VPC."
  }
}

variable "vpc_cidr" {
  description = "CIDR of the VPC the module creates (ignored with vpc_id)."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) <= 20
    error_message = "vpc_cidr must be an IPv4 CIDR of /20 or larger (it is cut into /24-or-larger subnets)."
  }
}

variable "az_count" {
  description = "Zones the created VPC spans. More zones = more spot pools for the workers."
  type        = number
  default     = 3

  validation {
    condition     = var.az_count >= 1 && var.az_count <= 6 && floor(var.az_count) == var.az_count
    error_message = "az_count must be a whole number from 1 to 6."
  }
}

variable "allowed_api_cidrs" {
  description = "CIDRs allowed to reach the orchestrator's API over HTTPS (port 443): your office or VPN. Workers reach it inside the VPC. Ranges wider than /8 (0.0.0.0/0 included) need allow_api_from_anywhere = true."
  type        = list(string)

  validation {
    condition     = length(var.allowed_api_cidrs) > 0 && alltrue([for c in var.allowed_api_cidrs : can(cidrhost(c, 0)) && !can(regex(":", c))])
    error_message = "allowed_api_cidrs needs at least one IPv4 CIDR such as 203.0.113.7/32."
  }

  validation {
    condition     = var.allow_api_from_anywhere || alltrue([for c in var.allowed_api_cidrs : !can(cidrhost(c, 0)) || tonumber(split("/", c)[1]) >= 8])
    error_message = "allowed_api_cidrs holds a range wider than /8 (such as 0.0.0.0/0): the admin API would be open to much of the internet. Narrow it, or set allow_api_from_anywhere = true if you mean it."
  }
}

variable "allow_api_from_anywhere" {
  description = "Accept allowed_api_cidrs wider than /8, such as 0.0.0.0/0. The API is then protected by its tokens, TLS and nginx's limits alone."
  type        = bool
  default     = false
}

variable "api_port" {
  description = "TCP port on which workers reach the orchestrator's API inside the VPC (plain HTTP through nginx; only the worker security group may connect). Users use HTTPS on 443."
  type        = number
  default     = 8000

  validation {
    condition     = var.api_port >= 1024 && var.api_port <= 65535 && var.api_port != 8001
    error_message = "api_port must be an unprivileged TCP port (1024-65535) other than 8001 (the orchestrator's own, on 127.0.0.1)."
  }
}

variable "domain_name" {
  description = "DNS name users reach the orchestrator by (you point its A record at the orchestrator_public_ip output). Set: nginx gets a Let's Encrypt certificate for it over HTTP-01, which opens port 80 to everyone for the challenge. Null: a self-signed certificate for the instance's addresses, made at boot (see docs/guides/aws.md)."
  type        = string
  default     = null

  validation {
    condition     = var.domain_name == null || can(regex("^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.domain_name))
    error_message = "domain_name must be a lowercase DNS name such as spotswarm.example.com."
  }
}

variable "proxy_max_connections_per_client" {
  description = "Requests one client address may have in progress at once through nginx; more are refused with 429 at once. Raise it when many users share one address (NAT)."
  type        = number
  default     = 32

  validation {
    condition     = var.proxy_max_connections_per_client >= 4 && var.proxy_max_connections_per_client <= 10000 && floor(var.proxy_max_connections_per_client) == var.proxy_max_connections_per_client
    error_message = "proxy_max_connections_per_client must be a whole number from 4 to 10000."
  }
}

variable "dht_port" {
  description = "TCP port of the orchestrator's hivemind DHT peer (workers dial it to join the swarm)."
  type        = number
  default     = 31330

  validation {
    condition     = var.dht_port >= 1024 && var.dht_port <= 65535
    error_message = "dht_port must be an unprivileged TCP port (1024-65535)."
  }
}

variable "worker_dht_port" {
  description = "TCP port each worker's DHT/averaging peer listens on (workers and orchestrator dial it); a worker instance of several GPUs runs one peer per GPU, on this port and the next 7."
  type        = number
  default     = 31331

  validation {
    condition     = var.worker_dht_port >= 1024 && var.worker_dht_port <= 65528
    error_message = "worker_dht_port must be an unprivileged TCP port (1024-65528: its next 7 are opened too)."
  }
}

# --- Orchestrator -------------------------------------------------------------------------------

variable "orchestrator_image" {
  description = "Container image of the orchestrator (built from deploy/Dockerfile.orchestrator), e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/spotswarm-orchestrator:0.1.0."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9./_:@-]+$", var.orchestrator_image)) && !endswith(var.orchestrator_image, ":latest")
    error_message = "orchestrator_image must be an image reference with a fixed tag or digest (not :latest)."
  }
}

variable "orchestrator_instance_type" {
  description = "On-demand instance type of the orchestrator (API, DHT peer and PostgreSQL on one machine)."
  type        = string
  default     = "t3.medium"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.orchestrator_instance_type))
    error_message = "orchestrator_instance_type must look like t3.medium."
  }
}

variable "orchestrator_ami_id" {
  description = "AMI of the orchestrator. Null: the latest Amazon Linux 2023 (x86_64) at apply time."
  type        = string
  default     = null

  validation {
    condition     = var.orchestrator_ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", var.orchestrator_ami_id))
    error_message = "orchestrator_ami_id must look like ami-0123456789abcdef0."
  }
}

variable "orchestrator_data_volume_gb" {
  description = "Size of the orchestrator's data volume (PostgreSQL, DHT identity, admin token); it outlives the instance."
  type        = number
  default     = 20

  validation {
    condition     = var.orchestrator_data_volume_gb >= 8 && var.orchestrator_data_volume_gb <= 16384
    error_message = "orchestrator_data_volume_gb must lie between 8 and 16384."
  }
}

variable "postgres_image" {
  description = "PostgreSQL image run next to the orchestrator."
  type        = string
  default     = "postgres:16.9-bookworm"

  validation {
    condition     = can(regex("^[a-z0-9./_-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.postgres_image)) && !endswith(var.postgres_image, ":latest")
    error_message = "postgres_image must carry a fixed tag or digest (not :latest)."
  }
}

variable "proxy_image" {
  description = "nginx image in front of the orchestrator (TLS, per-client limits)."
  type        = string
  default     = "nginx:1.28.0-alpine"

  validation {
    condition     = can(regex("^[a-z0-9./_-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.proxy_image)) && !endswith(var.proxy_image, ":latest")
    error_message = "proxy_image must carry a fixed tag or digest (not :latest)."
  }
}

variable "certbot_image" {
  description = "certbot image that gets and renews the Let's Encrypt certificate (only with domain_name)."
  type        = string
  default     = "certbot/certbot:v4.0.0"

  validation {
    condition     = can(regex("^[a-z0-9./_-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.certbot_image)) && !endswith(var.certbot_image, ":latest")
    error_message = "certbot_image must carry a fixed tag or digest (not :latest)."
  }
}

variable "enable_ssm_session" {
  description = "Attach AmazonSSMManagedInstanceCore to the orchestrator so you can open a shell with Session Manager (no SSH port is ever opened)."
  type        = bool
  default     = true
}

# --- Workers ------------------------------------------------------------------------------------

variable "worker_image" {
  description = "Container image of the worker (deploy/Dockerfile.worker, CUDA variant)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9./_:@-]+$", var.worker_image)) && !endswith(var.worker_image, ":latest")
    error_message = "worker_image must be an image reference with a fixed tag or digest (not :latest)."
  }
}

variable "worker_ami_id" {
  description = "GPU AMI of the workers, with the NVIDIA driver, Docker and the NVIDIA container toolkit. Null: the latest AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) at apply time."
  type        = string
  default     = null

  validation {
    condition     = var.worker_ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", var.worker_ami_id))
    error_message = "worker_ami_id must look like ami-0123456789abcdef0."
  }
}

variable "worker_instance_types" {
  description = "Default instance types of a run, in order of preference, and the only types the orchestrator may launch (a run may choose among them). More types = more spot pools = fewer failed launches."
  type        = list(string)
  default     = ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]

  validation {
    condition     = length(var.worker_instance_types) >= 1 && length(var.worker_instance_types) <= 20 && alltrue([for t in var.worker_instance_types : can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", t))])
    error_message = "worker_instance_types needs 1 to 20 instance types like g5.xlarge."
  }
}

variable "worker_root_volume_gb" {
  description = "Root volume of a worker (the Deep Learning AMI needs about 75 GB plus the image)."
  type        = number
  default     = 120

  validation {
    condition     = var.worker_root_volume_gb >= 30 && var.worker_root_volume_gb <= 2000
    error_message = "worker_root_volume_gb must lie between 30 and 2000."
  }
}

variable "worker_max_price" {
  description = "Default highest spot price in USD per instance-hour. Null: the on-demand price (AWS's advice)."
  type        = string
  default     = null

  validation {
    condition     = var.worker_max_price == null || can(regex("^[0-9]+(\\.[0-9]{1,5})?$", var.worker_max_price))
    error_message = "worker_max_price must be a decimal number such as \"0.75\"."
  }
}

variable "on_demand_fallback_after" {
  description = "Default: consecutive failed spot launches of a run before it may launch on-demand. Null: never."
  type        = number
  default     = null

  validation {
    condition     = var.on_demand_fallback_after == null || try(var.on_demand_fallback_after >= 0 && floor(var.on_demand_fallback_after) == var.on_demand_fallback_after, false)
    error_message = "on_demand_fallback_after must be null or a whole number >= 0."
  }
}

variable "ecr_repository_arns" {
  description = "ECR repositories the orchestrator and the workers may pull their images from (empty: images are public or elsewhere, and workers get no AWS permissions at all)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.ecr_repository_arns : can(regex("^arn:aws[a-z-]*:ecr:[a-z0-9-]+:[0-9]{12}:repository/.+$", a))])
    error_message = "ecr_repository_arns must be ECR repository ARNs."
  }
}

# --- Checkpoints --------------------------------------------------------------------------------

variable "checkpoint_bucket_name" {
  description = "Name of the checkpoint bucket the module creates. Null: <name>-checkpoints-<account id>."
  type        = string
  default     = null

  validation {
    condition     = var.checkpoint_bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.checkpoint_bucket_name))
    error_message = "checkpoint_bucket_name must be a valid S3 bucket name (3-63 lowercase characters)."
  }
}

variable "checkpoint_prefix" {
  description = "Key prefix of the checkpoints in the bucket; the orchestrator may only touch keys under it (workers never touch the bucket)."
  type        = string
  default     = "spotswarm"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)*$", var.checkpoint_prefix))
    error_message = "checkpoint_prefix must be a relative key prefix without leading or trailing '/'."
  }
}

variable "checkpoint_noncurrent_days" {
  description = "Days an overwritten or deleted checkpoint version is kept before S3 removes it."
  type        = number
  default     = 7

  validation {
    condition     = var.checkpoint_noncurrent_days >= 1 && var.checkpoint_noncurrent_days <= 3650
    error_message = "checkpoint_noncurrent_days must lie between 1 and 3650."
  }
}

variable "kms_key_arn" {
  description = "KMS key for the bucket's encryption. Null: SSE-S3 (AES256, no KMS charges)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "force_destroy_bucket" {
  description = "Let `terraform destroy` delete a bucket that still holds checkpoints."
  type        = bool
  default     = false
}
