"""What the orchestrator reports about itself and its runs.

- ``service.py``: the Prometheus registry of one app, its counters and histograms, and the launcher
  wrapper that counts launches.
- ``middleware.py``: every HTTP request timed under its route template.
- ``collector.py``: values read at scrape time from the database, the DHT cache and the reconcile loop.
- ``tensorboard.py``: each run's progress samples forwarded to TensorBoard (optional).
"""
