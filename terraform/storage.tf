# The checkpoint bucket: private, encrypted, versioned (a bad overwrite can be undone for
# checkpoint_noncurrent_days), unfinished multipart uploads cleaned up, TLS only.

resource "aws_s3_bucket" "checkpoints" {
  bucket        = local.bucket_name
  force_destroy = var.force_destroy_bucket
  tags          = merge(local.tags, { Name = local.bucket_name })
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket     = aws_s3_bucket.checkpoints.id
  depends_on = [aws_s3_bucket_versioning.checkpoints]

  rule {
    id     = "old-checkpoint-versions"
    status = "Enabled"

    filter {
      prefix = "${var.checkpoint_prefix}/"
    }

    noncurrent_version_expiration {
      noncurrent_days = var.checkpoint_noncurrent_days
    }

    expiration {
      expired_object_delete_marker = true
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }
}

resource "aws_s3_bucket_policy" "checkpoints" {
  bucket     = aws_s3_bucket.checkpoints.id
  depends_on = [aws_s3_bucket_public_access_block.checkpoints]
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "TlsOnly"
      Effect    = "Deny"
      Principal = "*"
      Action    = "s3:*"
      Resource  = [aws_s3_bucket.checkpoints.arn, "${aws_s3_bucket.checkpoints.arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
}
