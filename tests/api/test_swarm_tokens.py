"""``/api/v1/workers/{worker_id}/swarm-token`` and ``/api/v1/swarm-auth``: tokens only for registered, live
workers of admitted runs, signed by the key the orchestrator publishes, bound to the asking peer's key;
an opted-out run is listed as open. The app in-process (its DHT peer, a null one, takes the open list).
"""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import post_run, run_spec
from tests.support.waiting import wait_until
from tests.support.workers import ask_token, new_public_key, register
from worker.admission.tokens import TokenFields, TokenVerifier, openssh_public_key, peer_id_of

TOKEN_TTL_S = 90
ORCHESTRATOR_ENV = {**HAND_ONLY, "SPOTSWARM_SWARM_TOKEN_TTL_S": str(TOKEN_TTL_S)}


@pytest.mark.timeout(60)
def test_swarm_tokens_go_only_to_registered_live_workers_of_admitted_runs(api_app: Orchestrator) -> None:
    with api_app.client() as http:
        info = http.get(api.swarm_auth()).raise_for_status().json()
    assert info["enabled"] and info["authority_public_key"].startswith("ssh-rsa ")
    run = post_run(api_app, run_spec("adm-api"))
    worker, other = register(api_app, run["join_token"]), register(api_app, run["join_token"])
    key = new_public_key()

    assert ask_token(api_app, worker["worker_id"], None, key).status_code == 401
    assert ask_token(api_app, worker["worker_id"], other["worker_token"], key).status_code == 403
    assert ask_token(api_app, worker["worker_id"], run["join_token"], key).status_code == 403
    small = openssh_public_key(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key())
    assert ask_token(api_app, worker["worker_id"], worker["worker_token"], small).status_code == 422

    granted = ask_token(api_app, worker["worker_id"], worker["worker_token"], key).raise_for_status().json()
    token = TokenFields(
        granted["username"], granted["public_key"], granted["expiration_time"], granted["signature"]
    )
    assert granted["authority_public_key"] == info["authority_public_key"]
    assert TokenVerifier(info["authority_public_key"], run["swarm_id"]).problem(token) is None
    assert TokenVerifier(info["authority_public_key"], "another-swarm").problem(token) is not None
    assert granted["peer_id"] == peer_id_of(key) and token.subject == f"worker-{worker['worker_id']}"
    lifetime_s = token.expires_at() - time.time()
    assert 0 < lifetime_s <= info["token_ttl_s"]

    with api_app.client(worker["worker_token"]) as http:
        http.post(api.deregister(worker["worker_id"]), json={"reason": "stopped"}).raise_for_status()
    assert ask_token(api_app, worker["worker_id"], worker["worker_token"], key).status_code == 409

    opted_out = post_run(api_app, run_spec("adm-open", strategy_options={"swarm_admission": False}))
    member = register(api_app, opted_out["join_token"])
    refused = ask_token(api_app, member["worker_id"], member["worker_token"], key)
    assert refused.status_code == 409 and "swarm_admission is false" in refused.json()["detail"]

    def listed_open() -> bool:
        with api_app.client() as http:
            return opted_out["swarm_id"] in http.get(api.swarm_auth()).json()["open_swarms"]

    wait_until(listed_open, 30, message="the opted-out run reaches the DHT peer's open list")
