"""Programs the tests run as subprocesses (``python -m tests.programs.NAME ...``): swarm peers that train,
probe or join, a DiLoCo peer without Lightning, a stale DHT peer, a worker started by hand with a saved
peer list, a swarm observer; and the preloaded process most of them (and the tests' servers and agents)
are forked from."""
