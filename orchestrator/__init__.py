"""spotswarm's orchestrator: REST API, SQL state, the standalone DHT peer and the reconcile loop."""
