"""spotswarm's orchestrator: REST API, SQL state, the standalone DHT peer and the reconcile loop.

- ``app.py``: ``create_app``, the one composition root: every part below is built and wired there.
- ``config.py``: the settings (``SPOTSWARM_*`` variables, ``spotswarm serve`` flags); ``context.py``:
  the running parts routes are handed; ``background.py``: services that tick beside the API.
- ``schemas.py``: the REST API's request and response models (the domain builds them, routes return them).
- ``api/``: the HTTP edge (routes by resource, dependencies, the error table, middleware).
- ``domain/``: the rules of runs and workers (states, runs, workers, events, checkpoints, read views)
  and the use cases routes call (``usecases.py``: each owns its transaction and signals "changed").
- ``heartbeats/``: the hot path: the cache of live workers, the batch writer, the fast path.
- ``reconciler/``: the loop that keeps runs at their desired workers (pure policy, leader election).
- ``launchers/``: where workers run (``local``, ``ec2/``); ``storage/``: where checkpoints go.
- ``swarm/``: the orchestrator's DHT peer and swarm admission; ``metrics/``: Prometheus and TensorBoard.
- ``importcheck/``: a run's code checked at create time; ``db/``: tables, sessions, migrations.
- ``web/``: the status page and the API docs; ``cli/``: the ``spotswarm`` command.
- ``progress.py``: the progress types the DHT reader, the heartbeat flusher, the domain and the
  TensorBoard forwarder share (the swarm progress cache, a run's forwarded point).
- ``errors.py``, ``clock.py``, ``tokens.py``, ``ratelimit.py``, ``processes.py``: small shared pieces.

Each package and module is a layer of its own, and imports only the layers below it (``lint-imports``
checks it, ``pyproject.toml``): ``cli`` > ``app`` > ``web`` > ``api`` > ``metrics`` > ``context`` >
``heartbeats`` > ``config`` > ``reconciler`` | ``swarm`` > ``domain`` > the adapters (``importcheck``,
``db``, ``launchers``, ``storage``...) > the leaves (``errors``, ``progress``, ``processes``...).

Data flows one way: run spec -> API -> domain -> database -> reconciler -> launcher -> worker ->
heartbeat and checkpoint -> API -> domain -> database -> page and CLI.
"""
