"""The JSON API's paths for the tests, filled in from the templates the server routes by
(:class:`worker.wire.ApiPath`, with :data:`~worker.wire.API_PREFIX`): a test names the endpoint it calls,
``http.get(api.run(name))``, instead of writing ``f"/api/v1/runs/{name}"``, and a renamed route needs
no test edited. Import the module (``from tests.support import api``); one function a route template,
named as in ``ApiPath``, taking that template's parameters. Paths a test builds on purpose (a traversal,
an unknown route, a malformed id) stay written out in the test.
"""

from __future__ import annotations

from worker.wire import API_PREFIX, ApiPath


def _full(template: str, **params: object) -> str:
    """``template`` (an :class:`ApiPath` attribute) with its parameters filled in, prefix included."""
    return API_PREFIX + template.format(**params)


def runs() -> str:
    return _full(ApiPath.runs)


def run(name: str) -> str:
    return _full(ApiPath.run, name=name)


def run_scale(name: str) -> str:
    return _full(ApiPath.run_scale, name=name)


def run_stop(name: str) -> str:
    return _full(ApiPath.run_stop, name=name)


def run_resume(name: str) -> str:
    return _full(ApiPath.run_resume, name=name)


def run_join_token(name: str) -> str:
    return _full(ApiPath.run_join_token, name=name)


def run_revoke_manual(name: str) -> str:
    return _full(ApiPath.run_revoke_manual, name=name)


def run_events(name: str) -> str:
    return _full(ApiPath.run_events, name=name)


def run_progress(name: str) -> str:
    return _full(ApiPath.run_progress, name=name)


def run_workers(name: str) -> str:
    return _full(ApiPath.run_workers, name=name)


def run_worker_log(name: str, worker_id: str | int) -> str:
    return _full(ApiPath.run_worker_log, name=name, worker_id=worker_id)


def run_peers(name: str) -> str:
    return _full(ApiPath.run_peers, name=name)


def run_package(name: str) -> str:
    return _full(ApiPath.run_package, name=name)


def run_checkpoints(name: str) -> str:
    return _full(ApiPath.run_checkpoints, name=name)


def run_latest_checkpoint(name: str) -> str:
    return _full(ApiPath.run_latest_checkpoint, name=name)


def run_checkpoint(name: str, epoch: int | str) -> str:
    return _full(ApiPath.run_checkpoint, name=name, epoch=epoch)


def run_checkpoint_item(name: str, epoch: int | str) -> str:
    return _full(ApiPath.run_checkpoint_item, name=name, epoch=epoch)


def package(sha256: str) -> str:
    return _full(ApiPath.package, sha256=sha256)


def peers() -> str:
    return _full(ApiPath.peers)


def swarm_auth() -> str:
    return _full(ApiPath.swarm_auth)


def register() -> str:
    return _full(ApiPath.register)


def heartbeat(worker_id: str | int) -> str:
    return _full(ApiPath.heartbeat, worker_id=worker_id)


def deregister(worker_id: str | int) -> str:
    return _full(ApiPath.deregister, worker_id=worker_id)


def swarm_token(worker_id: str | int) -> str:
    return _full(ApiPath.swarm_token, worker_id=worker_id)


def checkpoint_upload(worker_id: str | int, epoch: int | str) -> str:
    return _full(ApiPath.checkpoint_upload, worker_id=worker_id, epoch=epoch)


def resume_failure(worker_id: str | int) -> str:
    return _full(ApiPath.resume_failure, worker_id=worker_id)
