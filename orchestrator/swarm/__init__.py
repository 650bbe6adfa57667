"""The orchestrator in its runs' swarms: its own DHT peer and swarm admission.

- ``dht.py``: the orchestrator's DHT peer and the reader of each run's swarm progress (into the cache
  of ``orchestrator/progress.py``).
- ``dht_process.py``: the peer's process ends with the server; a stale one is found and stopped.
- ``admission.py``: the signing authority, tokens for registered workers, the runs that opted out.
- ``peer_authorizer.py``: the hivemind authorizer of the orchestrator's own peer (imports hivemind).

The peer side of admission (what workers run) is ``worker/admission/``.
"""
