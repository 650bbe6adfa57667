"""The ``ec2`` launcher: workers on EC2 spot instances, one instant EC2 Fleet per instance, which runs one
worker, or one per GPU.

- ``launcher.py``: the launcher (launch, terminate, describe, poll errors) over a boto3 client.
- ``settings.py``: its settings (``Settings.ec2``: ``SPOTSWARM_EC2_*``), which the launcher takes as they are.
- ``fleet.py``: pure pieces: run options, the ``CreateFleet`` request, AWS error kinds.
- ``gpus.py``: GPUs per instance type, and so how many peers (one per GPU) an instance of a run runs.
- ``pricing.py``: current spot prices per instance type and zone, cached.
- ``userdata.py``: a worker's cloud-init user data, rendered from ``deploy/cloud-init/worker.yaml``
  (one container per peer).
"""
