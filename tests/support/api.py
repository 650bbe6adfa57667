"""The JSON API's paths for the tests, filled in from the templates the server routes by
(:class:`worker.protocol.paths.ApiPath`, with :data:`~worker.protocol.paths.API_PREFIX`): a test names
the endpoint it calls, ``http.get(api.run(name))``, instead of writing ``f"/api/v1/runs/{name}"``, and a
renamed route needs no test edited. Import the module (``from tests.support import api``); one
:class:`Route` a route template, named as in ``ApiPath``, called with that template's parameters in their
order (``api.run_worker_log(name, worker_id)``). Paths a test builds on purpose (a traversal, an unknown
route, a malformed id, a query string) stay written out in the test.
"""

from __future__ import annotations

import re

from worker.protocol.paths import API_PREFIX, ApiPath

_PARAMETER = re.compile(r"\{(\w+)\}")


class Route:
    """One route of the JSON API; calling it with the template's parameters gives the full path."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.parameters = tuple(_PARAMETER.findall(template))

    def __call__(self, *values: object) -> str:
        """The path with ``values`` filled in, in the template's order; TypeError if they do not fit."""
        if len(values) != len(self.parameters):
            raise TypeError(f"{self.template} takes {self.parameters}, got {len(values)} values")
        return API_PREFIX + self.template.format(**dict(zip(self.parameters, values, strict=True)))


runs = Route(ApiPath.runs)
run = Route(ApiPath.run)
run_scale = Route(ApiPath.run_scale)
run_stop = Route(ApiPath.run_stop)
run_resume = Route(ApiPath.run_resume)
run_join_token = Route(ApiPath.run_join_token)
run_revoke_manual = Route(ApiPath.run_revoke_manual)
run_events = Route(ApiPath.run_events)
run_progress = Route(ApiPath.run_progress)
run_workers = Route(ApiPath.run_workers)
run_worker_log = Route(ApiPath.run_worker_log)
run_peers = Route(ApiPath.run_peers)
run_package = Route(ApiPath.run_package)
run_checkpoints = Route(ApiPath.run_checkpoints)
run_latest_checkpoint = Route(ApiPath.run_latest_checkpoint)
run_checkpoint = Route(ApiPath.run_checkpoint)
run_checkpoint_item = Route(ApiPath.run_checkpoint_item)
package = Route(ApiPath.package)
peers = Route(ApiPath.peers)
swarm_auth = Route(ApiPath.swarm_auth)
register = Route(ApiPath.register)
heartbeat = Route(ApiPath.heartbeat)
deregister = Route(ApiPath.deregister)
swarm_token = Route(ApiPath.swarm_token)
checkpoint_upload = Route(ApiPath.checkpoint_upload)
resume_failure = Route(ApiPath.resume_failure)
