"""The JSON API's paths, defined once: the orchestrator declares its routes with them, every client calls
them (``ApiPath.heartbeat.format(worker_id=7)``).

Endpoints that carry the models of :mod:`worker.protocol.workers` and :mod:`worker.protocol.swarm_tokens`
(all under ``/api/v1``):

==========================================  ================  =======================================
``POST /workers/register``                  join or launch    :class:`WorkerRegister` ->
                                                              :class:`WorkerRegistered`
``POST /workers/{worker_id}/heartbeat``     worker token      :class:`Heartbeat` -> :class:`HeartbeatReply`
``POST /workers/{worker_id}/deregister``    worker token      :class:`Deregister` -> 204
``PUT  /workers/{worker_id}/checkpoints/{epoch}``  worker token  raw bytes, header ``X-Checksum-Sha256``
``GET  /runs/{name}/checkpoints/latest/download``  worker/run/admin token   raw bytes
``GET  /runs/{name}/package``               worker/run/admin token  the run's code package (raw bytes)
``GET  /runs/{name}/peers``                 none              :class:`PeerList`
``POST /workers/{worker_id}/swarm-token``  worker token      :class:`SwarmTokenRequest` -> :class:`SwarmToken`
``GET  /swarm-auth``                        none              :class:`SwarmAuthInfo`
==========================================  ================  =======================================
"""

from __future__ import annotations

import re

#: The prefix of the JSON API; :class:`ApiPath` templates are relative to it.
API_PREFIX = "/api/v1"


class ApiPath:
    """Route templates of the JSON API, relative to :data:`API_PREFIX`; a client fills one in with
    ``str.format`` (``ApiPath.heartbeat.format(worker_id=7)``)."""

    runs = "/runs"
    run = "/runs/{name}"
    run_scale = "/runs/{name}/scale"
    run_stop = "/runs/{name}/stop"
    run_resume = "/runs/{name}/resume"
    run_join_token = "/runs/{name}/join-token"
    run_revoke_manual = "/runs/{name}/manual-workers/revoke"
    run_events = "/runs/{name}/events"
    run_progress = "/runs/{name}/progress"
    run_workers = "/runs/{name}/workers"
    run_worker_log = "/runs/{name}/workers/{worker_id}/log"
    run_peers = "/runs/{name}/peers"
    run_package = "/runs/{name}/package"
    run_checkpoints = "/runs/{name}/checkpoints"
    run_latest_checkpoint = "/runs/{name}/checkpoints/latest/download"
    run_checkpoint = "/runs/{name}/checkpoints/{epoch}/download"
    run_checkpoint_item = "/runs/{name}/checkpoints/{epoch}"
    package = "/packages/{sha256}"
    peers = "/peers"
    swarm_auth = "/swarm-auth"
    register = "/workers/register"
    heartbeat = "/workers/{worker_id}/heartbeat"
    deregister = "/workers/{worker_id}/deregister"
    swarm_token = "/workers/{worker_id}/swarm-token"
    checkpoint_upload = "/workers/{worker_id}/checkpoints/{epoch}"
    resume_failure = "/workers/{worker_id}/resume-failures"


#: The heartbeat's full route template: the route, its fast path and its request metrics all use it.
HEARTBEAT_ROUTE = API_PREFIX + ApiPath.heartbeat


def path_regex(template: str, **groups: str) -> str:
    """A regex of the full paths of an :class:`ApiPath` template: each ``{param}`` matches one path
    segment, or the pattern ``groups`` gives for it."""
    pattern = re.escape(API_PREFIX + template)
    for name in re.findall(r"\{(\w+)\}", template):
        pattern = pattern.replace(re.escape("{" + name + "}"), groups.get(name, "[^/]+"))
    return f"^{pattern}$"


CHECKSUM_HEADER = "X-Checksum-Sha256"
