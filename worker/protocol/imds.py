"""The EC2 instance metadata service (IMDSv2) as spot workers read it: paths, headers, and the variable
that points a worker elsewhere (the local launcher's simulated spot market serves the same paths).

EC2 announces a spot interruption about two minutes ahead at :data:`INSTANCE_ACTION_PATH` and, often
earlier, a rebalance recommendation at :data:`REBALANCE_PATH`; every read carries a session token from
``PUT`` :data:`TOKEN_PATH`. The watcher is ``worker/agent/spot.py``.
"""

from __future__ import annotations

#: the metadata base URL a worker reads (default :data:`DEFAULT_METADATA_URL`; ``off`` disables it)
METADATA_URL_ENV = "SPOTSWARM_METADATA_URL"
DEFAULT_METADATA_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
