"""What the tests share, one module per job (the fixtures live in ``tests/conftest.py``).

- ``processes.py``: subprocesses in their own process group, always killed; what outlives a stop.
- ``preloaded.py``: those processes forked from one that already imported them (``spotswarm``,
  ``spotswarm-worker``, the test programs), seconds of CPU less per start.
- ``waiting.py``: ``wait_until`` (a condition with a deadline), ``wait_for_file``, ``BOOT_S``.
- ``ports.py``: free TCP ports.
- ``api.py``: the JSON API's paths, one function a route (``api.run(name)``), filled in from
  ``ApiPath``: tests name the endpoint instead of writing ``/api/v1/...``.
- ``sockets.py``: connections that hold a server's sockets with unfinished requests (one client's flood).
- ``orchestrator.py``: ``spotswarm serve`` as a subprocess, ``ApiServer`` (what both kinds of
  orchestrator offer a test: API clients, the database), and the settings presets every test starts
  its orchestrator with (``TEST_ENV``, ``NO_RECONCILE``, ``HAND_ONLY``, ``LOOP_ENV``, ``FUZZ_ENV``).
- ``inprocess.py``: the app in-process (``create_app`` with a null DHT, through httpx's ASGI transport):
  what the API tests (``tests/api/``) run against; ``null_dht.py``: that DHT peer.
- ``specs.py`` and ``models.py``: a valid run spec (and runs created from it), the tiny Lightning
  classes it names.
- ``workers.py``: register, heartbeat, become the checkpointer, ask for a swarm token, as a worker does
  over the API; ``operability.py``: launch intents, workers joined through the agent's client, scrapes
  of ``/metrics``.
- ``cli.py``: the ``spotswarm`` CLI in-process, and workers joined by hand through the agent's client.
- ``checkpoint_files.py``: checkpoint bytes the server's format check takes, made without torch (and one
  that does not load).
- ``agent.py``, ``runs.py``: agents started by hand (alone, or one training beside an orchestrator), or an
  orchestrator with the reconcile loop and its readers, and the digits run (``digits_run``);
  ``spot_market.py``: a simulated spot market following a trace the test writes.
- ``archives.py``: hand-made tar archives, the crafted code packages among them.
- ``postgres.py`` (``running_postgres``), ``aws.py`` (moto; the workers' network and launch template
  on it, what an instance's user data gives its worker), ``imds.py`` (EC2's instance metadata
  service), ``ec2_capacity.py``, ``failover_proxy.py``, ``browser.py``, ``terraform.py``, ``wheels.py``,
  ``docs_commands.py``, ``fuzz.py``, ``strategy.py``, ``monitor_peer.py``: the other systems and
  harnesses tests drive; ``diloco.py``: DiLoCo peers without Lightning and the plain-torch reference of
  the outer step.
"""
