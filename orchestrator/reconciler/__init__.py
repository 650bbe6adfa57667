"""The reconcile loop: observe what launchers report, decide per run, record the intent, then act.

- ``loop.py``: one tick (observe -> decide and record in one transaction -> launch and terminate after
  the commit); the orphan instances no worker row knows are terminated here too.
- ``service.py``: the background service that runs ticks in a thread, only on the leader.
- ``policy.py``: the decision for one run in one tick, a pure function of views of what was observed,
  and the settings it decides by (``ReconcileSettings``, nested in the server's as ``reconciler``).
- ``leader.py``: with several orchestrators on one database, only the leader ticks.
"""
