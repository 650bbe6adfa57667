"""Launcher backends: how the reconcile loop starts and stops workers on some kind of machine.

- ``base.py``: the ``Launcher`` protocol and its data (requests, instances, failures); a launch starts one
  machine of one or more peers (``peers_per_machine``).
- ``local.py``: workers as subprocesses of this machine; ``local_files.py``: its state files and logs;
  ``forkserver.py`` and ``forkserver_main.py``: the process it forks preloaded workers from;
  ``local_cpus.py``: cores of their own for its workers (``cpus_per_worker``).
- ``spot_market.py``: a simulated spot market (capacity traces, a seeded random market);
  ``spot_local.py``: the local launcher obeying it; ``spot_imds.py``: the metadata service its workers
  poll for their spot notices.
- ``ec2/``: workers on EC2 spot instances.
- ``childenv.py``: the environment of processes that run user code (local workers, the import probe).
- ``worker_logs.py``: where a worker's log is and how its tail is read.
"""
