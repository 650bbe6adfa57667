"""spotswarm's worker side: the Lightning ``HivemindStrategy``, the worker agent and examples.

Importing this package is cheap: heavy modules (torch, lightning, hivemind) load only when
``worker.strategy`` or ``worker.agent`` is imported. This package never imports ``orchestrator``.
"""
