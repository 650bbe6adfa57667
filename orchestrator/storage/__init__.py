"""Checkpoint storage backends: ``base`` (the interface), ``local`` (a directory), ``s3``."""
