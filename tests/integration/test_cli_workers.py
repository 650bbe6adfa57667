"""`spotswarm workers list`, `checkpoints list|download` and `peers` against a real orchestrator, with
workers joined by hand (register, heartbeat, upload a checkpoint, leave)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.client import EXIT_AUTH, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from tests.support import api
from tests.support.checkpoint_files import NotAWeight, checkpoint_bytes
from tests.support.cli import HandWorker, cli
from tests.support.orchestrator import Orchestrator
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from worker.protocol.workers import DeregisterReason


@pytest.fixture(scope="module")
def joined(served_orch: Orchestrator) -> Iterator[tuple[HandWorker, HandWorker]]:
    """Run "crew" with two hand-joined workers that have each sent a heartbeat."""
    created = cli(served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("crew")))
    assert created.exit_code == 0, created.output
    join = json.loads(created.stdout)["join_token"]
    first, second = (
        HandWorker(served_orch, join, "host-a", validates=True),
        HandWorker(served_orch, join, "host-b"),
    )
    first.beat(40.0)
    second.beat(60.0)
    yield first, second


@pytest.mark.timeout(60)
def test_workers_list_shows_live_workers_and_how_others_ended(
    served_orch: Orchestrator, joined: tuple
) -> None:
    first, second = joined
    second.leave(DeregisterReason.interrupted, "spot notice")

    def listed() -> dict:
        result = cli(served_orch, "workers", "list", "crew", "--json")
        items = {w["id"]: w for w in json.loads(result.stdout)["items"]}
        ended = items[second.worker_id]["state"] == "interrupted"
        return items if ended and items[first.worker_id]["samples"] else {}

    wait_until(listed, 10, message="interruption and heartbeat visible")
    table = cli(served_orch, "workers", "list", "crew")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATE", "HANDLE"] and "METRICS" in lines[0].split()
    row_a = next(line for line in lines if "host-a" in line)
    row_b = next(line for line in lines if "host-b" in line)
    assert "val_acc=" in row_a and "val_loss=" in row_a and "val_" not in row_b
    assert (
        " running " in row_a
        and "interrupted: spot notice" in row_b
        and "interrupted: interrupted" not in row_b
    )
    live = cli(served_orch, "workers", "list", "crew", "--live")
    assert "host-a" in live.stdout and "host-b" not in live.stdout


@pytest.mark.timeout(60)
def test_workers_list_marks_a_cut_reason_and_wide_shows_it_whole(served_orch: Orchestrator) -> None:
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("crew-long"))
    )
    join = json.loads(created.stdout)["join_token"]
    worker = HandWorker(served_orch, join, "host-c")
    worker.beat(40.0)
    reason = "the data loader gave up after reading shard 17 of the bucket three times, then the host went"
    worker.leave(DeregisterReason.interrupted, reason)

    def table(*flags: str) -> str:
        result = cli(served_orch, "workers", "list", "crew-long", *flags)
        assert result.exit_code == 0, result.output
        return str(result.stdout)

    wait_until(lambda: "interrupted" in table(), 10, message="the worker's end listed")
    cut = table()
    assert reason not in cut and "interrupted: the data loader gave up" in cut
    assert "…" in next(line for line in cut.splitlines() if "host-c" in line)
    assert "reason cut; --wide or --json shows it whole" in cut
    wide = table("--wide")
    assert f"interrupted: {reason}" in wide and "…" not in wide


@pytest.mark.timeout(60)
def test_checkpoints_list_and_download_verified(
    served_orch: Orchestrator, joined: tuple, tmp_path: Path
) -> None:
    first, _ = joined
    blobs = {}
    for epoch in (2, 4):
        path = tmp_path / f"upload-{epoch}.ckpt"
        # stored (its format is right) but no torch.load(weights_only=True) builds it: export must refuse it
        path.write_bytes(checkpoint_bytes(bytes([epoch]) * (300_000 + epoch), extra={"obj": NotAWeight()}))
        blobs[epoch] = hashlib.sha256(path.read_bytes()).hexdigest()
        first.upload(epoch, path)

    listed = cli(served_orch, "checkpoints", "list", "crew")
    assert listed.exit_code == 0, listed.output
    epochs = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert epochs == ["4", "2"]  # newest first

    latest = cli(served_orch, "checkpoints", "download", "crew", "-o", str(tmp_path), "--json")
    assert latest.exit_code == 0, latest.output
    saved = json.loads(latest.stdout)
    assert saved["epoch"] == 4 and saved["sha256"] == blobs[4]
    assert hashlib.sha256(Path(saved["path"]).read_bytes()).hexdigest() == blobs[4]

    older = cli(served_orch, "checkpoints", "download", "crew", "2", "-o", str(tmp_path / "two.ckpt"))
    assert older.exit_code == 0 and "saved epoch 2" in older.stdout
    assert hashlib.sha256((tmp_path / "two.ckpt").read_bytes()).hexdigest() == blobs[2]

    missing = cli(served_orch, "checkpoints", "download", "crew", "3", "-o", str(tmp_path))
    assert missing.exit_code == EXIT_NOT_FOUND and "have: 4, 2" in missing.stderr
    assert not list(tmp_path.glob("*.part"))

    before = sorted(tmp_path.iterdir())
    not_a_model = cli(served_orch, "runs", "export", "crew", "-o", str(tmp_path / "model.ckpt"))
    assert not_a_model.exit_code == EXIT_ERROR, not_a_model.output
    assert len(not_a_model.stderr.strip().splitlines()) == 1, not_a_model.stderr
    assert "does not load with torch.load(weights_only=True)" in not_a_model.stderr
    assert sorted(tmp_path.iterdir()) == before, "no file, no scratch directory left behind"


@pytest.mark.timeout(30)
def test_peers_prints_an_initial_peers_line(served_orch: Orchestrator, joined: tuple) -> None:
    result = cli(served_orch, "peers", "crew")
    assert result.exit_code == 0, result.output
    last = result.stdout.splitlines()[-1]
    assert last.startswith("INITIAL_PEERS=/ip4/127.0.0.1/tcp/")
    assert set(last.removeprefix("INITIAL_PEERS=").split(",")) >= set(served_orch.peers())
    own = cli(served_orch, "peers")
    assert own.exit_code == 0 and f"/tcp/{served_orch.dht_port}/p2p/" in own.stdout


@pytest.mark.timeout(30)
def test_runs_show_totals_the_shares_workers_list_shows(served_orch: Orchestrator, joined: tuple) -> None:
    """`runs show` adds up the workers it lists itself (each share shown): the run's own total is read in
    another request, and workers' counts move by a heartbeat's worth at a time."""
    first, _ = joined
    first.beat()

    def agreeing() -> tuple[str, list[int]] | None:
        items = json.loads(cli(served_orch, "workers", "list", "crew", "--json").stdout)["items"]
        shares = [w["samples"] for w in items if w["samples"]]
        shown = cli(served_orch, "runs", "show", "crew").stdout
        line = next(line for line in shown.splitlines() if line.split()[:1] == ["samples"])
        return (line, shares) if line.split()[1] == str(sum(shares)) else None

    line, shares = wait_until(agreeing, 10)  # once the last heartbeat is written (a flush interval)
    assert len(shares) == 2 and " + ".join(str(n) for n in shares) in line and "from 2 worker(s)" in line


@pytest.mark.timeout(60)
def test_checkpoints_delete_one_epoch_or_every_upload_of_a_worker(
    served_orch: Orchestrator, tmp_path: Path
) -> None:
    """The admin's answer to a checkpoint that does not load, or to a worker it no longer trusts: before,
    no route deleted a checkpoint, and a resumed run got the same bad one again."""
    created = cli(served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("purge")))
    worker = HandWorker(served_orch, json.loads(created.stdout)["join_token"], "host-p")
    for epoch in (1, 3, 5):
        path = tmp_path / f"upload-{epoch}.ckpt"
        path.write_bytes(checkpoint_bytes(bytes([epoch]) * 1000))
        worker.upload(epoch, path)

    one = cli(served_orch, "checkpoints", "delete", "purge", "5", "--yes")
    assert one.exit_code == 0 and "deleted checkpoints of run purge: epochs 5" in one.stdout, one.output
    gone = cli(served_orch, "checkpoints", "delete", "purge", "5", "--yes")
    assert gone.exit_code == EXIT_NOT_FOUND and "no checkpoint at epoch 5" in gone.stderr, gone.output
    neither = cli(served_orch, "checkpoints", "delete", "purge", "--yes")
    assert neither.exit_code == EXIT_USAGE and "EPOCH or --uploaded-by" in neither.stderr, neither.output
    as_join = cli(served_orch, "checkpoints", "delete", "purge", "3", "--yes", token=worker.client.token)
    assert as_join.exit_code == EXIT_AUTH, as_join.output

    every = cli(
        served_orch, "checkpoints", "delete", "purge", "--uploaded-by", worker.worker_id, "--yes", "--json"
    )
    assert every.exit_code == 0, every.output
    assert [c["epoch"] for c in json.loads(every.stdout)["items"]] == [3, 1]
    assert cli(served_orch, "checkpoints", "list", "purge", "--json").stdout.count('"epoch"') == 0
    events = json.loads(cli(served_orch, "runs", "logs", "purge", "--json").stdout.splitlines()[-1])
    assert events["message"] == f"epochs 3, 1 (uploaded by worker {worker.worker_id}) deleted by the admin"
    assert worker.beat().latest_checkpoint_epoch is None  # the heartbeat replies forget them at once


@pytest.mark.timeout(60)
def test_runs_revoke_manual_workers_ends_them_and_their_tokens(served_orch: Orchestrator) -> None:
    """Before, a hand-joined worker's token worked as long as its run lived, join-token rotation or not."""
    created = cli(
        served_orch, "runs", "create", "--json", "--file", "-", stdin=json.dumps(run_spec("revoked"))
    )
    worker = HandWorker(served_orch, json.loads(created.stdout)["join_token"], "host-r")
    worker.beat()
    revoked = cli(served_orch, "runs", "revoke-manual-workers", "revoked", "--yes")
    assert revoked.exit_code == 0, revoked.output
    assert revoked.stdout.strip() == f"revoked the workers of run revoked joined by hand: {worker.worker_id}"
    assert worker.beat().action == "stop"
    with served_orch.client(worker.client.token) as http:
        answer = http.get(api.run_latest_checkpoint("revoked"))
    assert answer.status_code == 403 and "has ended" in answer.json()["detail"], answer.text
    again = cli(served_orch, "runs", "revoke-manual-workers", "revoked", "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["revoked"] == []
