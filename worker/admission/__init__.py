"""Swarm admission on the peer side: hold a token from the orchestrator, refuse peers without one.

- ``tokens.py``: the token format, signing and checking (the orchestrator signs with the same code).
- ``authorizer.py``: the hivemind authorizer that signs and checks every DHT call, and the peer identity.
- ``guard.py``: the guard of the averagers' handlers, which hivemind does not authorize.

The orchestrator's side (the authority, the peer authorizer of its own DHT peer) is
``orchestrator/swarm/``; the design and threat model are in the security guide.
"""
