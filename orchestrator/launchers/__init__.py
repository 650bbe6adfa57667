"""Launcher backends: ``base`` (the interface), ``local`` (subprocess workers), ``ec2`` (spot instances)."""
