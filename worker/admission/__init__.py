"""Swarm admission on the peer side: hold a token from the orchestrator, refuse peers without one.

- ``tokens.py``: the token format, signing and checking (the orchestrator signs with the same code).
- ``access_tokens.py``: the same tokens as hivemind's ``AccessToken``.
- ``guard.py``: the guard of the averagers' handlers, which hivemind does not authorize.
- ``authorizer.py``: the hivemind authorizer that signs and checks every DHT call, the peer identity,
  and the DHT peer of a swarm with admission (``AdmissionDHT``), which uses both.

This package builds on the strategy's hivemind pieces (``worker/strategy/dht.py``,
``worker/_hivemind_compat.py``); the strategy needs nothing of it: it takes any authorizer that can start
its DHT (``worker.strategy.dht.PeerAuthorizer``).

The orchestrator's side (the authority, the peer authorizer of its own DHT peer) is
``orchestrator/swarm/``; the design and threat model are in the security guide.
"""
