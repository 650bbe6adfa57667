"""Programs the tests run as subprocesses (``python -m tests.programs.NAME ...``): swarm peers that train,
probe or join, a stale DHT peer, a worker started by hand with a saved peer list, and a swarm observer."""
