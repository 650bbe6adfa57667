terraform {
  # 1.9+: variable validations that refer to other variables; tested with 1.11.
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Tested with 5.100.0 (the mirrored provider); 6.x renames inputs this module uses.
      version = ">= 5.100.0, < 6.0.0"
    }
  }
}
