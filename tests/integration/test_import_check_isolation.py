"""The import check of `spotswarm serve` runs a run's code in a process without the server's secrets
(admin token, database URL, data dir and port are in the server's environment) and outside its data dir:
a real server, on SQLite and on PostgreSQL (where the database URL, with its password, is set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, OrchestratorFactory
from tests.support.specs import run_spec

ADMIN_TOKEN = "ssa_set-by-the-operator-in-the-environment"
SERVER_ONLY = {"SPOTSWARM_ADMIN_TOKEN", "SPOTSWARM_DATABASE_URL", "SPOTSWARM_DATA_DIR", "SPOTSWARM_PORT"}
# Imported by the import check: records the environment and working directory it ran with.
PROBE_SPY = """
import json, os, pathlib
seen = {"env": dict(os.environ), "cwd": os.getcwd()}
pathlib.Path(__file__).with_name("seen.json").write_text(json.dumps(seen))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_import_check_runs_user_code_without_the_servers_secrets_outside_the_data_dir(
    orchestrator_factory: OrchestratorFactory, tmp_path: Path, backend: str
) -> None:
    user_code = tmp_path / "usercode"  # a user's module on the server's import path
    user_code.mkdir()
    (user_code / "probe_spy.py").write_text(PROBE_SPY)
    env = {**NO_RECONCILE, "PYTHONPATH": str(user_code)}
    orch = orchestrator_factory(env, backend=backend, admin_token=ADMIN_TOKEN)
    with orch.admin() as http:
        answer = http.post(api.runs(), json=run_spec("spied", module="probe_spy:NoSuchModule"))
    assert answer.status_code == 422 and "no attribute 'NoSuchModule'" in answer.text, answer.text
    seen = json.loads((user_code / "seen.json").read_text())
    assert ADMIN_TOKEN not in json.dumps(seen)
    assert (backend == "postgres") == bool(orch.db_url)
    assert orch.db_url is None or orch.db_url not in json.dumps(seen)
    assert not {name for name in seen["env"] if name in SERVER_ONLY}, sorted(seen["env"])
    assert not Path(seen["cwd"]).resolve().is_relative_to(orch.data_dir.resolve()), seen["cwd"]
    assert Path(seen["cwd"]).resolve() != Path.cwd().resolve()
