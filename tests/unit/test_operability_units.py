"""Small pieces of operability: log lines (text and JSON), route templates as metric labels, per-app
metric registries, launch counting on a real local launcher, and bounded log tails."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.errors import Conflict, NotFound
from orchestrator.launchers.base import LauncherConfigError, LaunchRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.worker_logs import read_tail, worker_log_path
from orchestrator.metrics.middleware import route_template
from orchestrator.metrics.service import ServiceMetrics
from tests.support import api
from tests.support.waiting import wait_until
from worker.protocol.redaction import redact
from worker.runtime.logsetup import configure_logging, log_fields, set_log_context, set_log_secrets


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        set_log_context()
        set_log_secrets(())
        logging.captureWarnings(False)
        root.handlers[:] = handlers
        root.setLevel(level)


# -- log lines ----------------------------------------------------------------------------------------


def test_json_lines_carry_run_worker_event_and_tracebacks(restore_logging: None) -> None:
    out = io.StringIO()
    assert configure_logging("INFO", "json", stream=out, hivemind=False, lightning=False) == "json"
    log = logging.getLogger("orchestrator.domain.runs")
    log.info("launching -> running", extra=log_fields(run="digits", worker=3, event="worker.state"))
    set_log_context(run="digits", worker="7")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("worker.agent").exception("training failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {
        "timestamp": first["timestamp"],
        "level": "info",
        "logger": "orchestrator.domain.runs",
        "run": "digits",
        "worker": "3",
        "event": "worker.state",
        "message": "launching -> running",
    }
    assert first["timestamp"].endswith("Z") and "T" in first["timestamp"]
    assert (second["run"], second["worker"], second["event"], second["level"]) == (
        "digits",
        "7",
        None,
        "error",
    )
    assert "RuntimeError: boom" in second["exception"]


def test_text_is_the_default_and_the_env_variable_picks_json(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.delenv("SPOTSWARM_LOG_FORMAT", raising=False)
    assert configure_logging("INFO", stream=out, hivemind=False, lightning=False) == "text"
    runs_logger = logging.getLogger("orchestrator.domain.runs")
    runs_logger.warning("x -> y", extra=log_fields(run="r", event="run.state"))
    assert "WARNING [run=r] orchestrator.domain.runs: run.state: x -> y" in out.getvalue()
    monkeypatch.setenv("SPOTSWARM_LOG_FORMAT", "JSON")
    assert configure_logging("INFO", stream=out, hivemind=False, lightning=False) == "json"
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("INFO", "xml", hivemind=False, lightning=False)


def test_text_lines_escape_control_characters_so_values_cannot_forge_lines(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", "text", stream=out, hivemind=False, lightning=False)
    forged = "gpu-1\n2026-11-23 14:40:00,000 WARNING orchestrator.domain.runs: run.deleted FORGED"
    workers_logger = logging.getLogger("orchestrator.domain.workers")
    workers_logger.info("joined from %s", forged, extra=log_fields(run="r\rx"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("worker.agent").exception("failed \x1b[31m\u2028")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(
        "[run=r\\rx] orchestrator.domain.workers: joined from gpu-1\\n2026-11-23 14:40:00,000 "
        "WARNING orchestrator.domain.runs: run.deleted FORGED"
    ), lines
    assert lines[1].endswith("worker.agent: failed \\x1b[31m\\u2028"), lines
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: boom"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_runs_secret_values_are_masked_in_every_line_and_traceback(restore_logging: None, fmt: str) -> None:
    """A worker names its run's secret_env values once registered; user code's exceptions quote them."""
    out = io.StringIO()
    configure_logging("INFO", fmt, stream=out, hivemind=False, lightning=False)
    secret = 'sk-"LEAK\\ME'  # a quote and a backslash: JSON would escape them
    set_log_secrets([secret, "abc", None])  # values under 4 characters are no credential: kept
    log = logging.getLogger("worker.agent")
    log.error("cannot build: 401 for url: https://api.example/whoami?token=%s (abc)", secret)
    try:
        raise RuntimeError(f"token={secret}")
    except RuntimeError:
        log.exception("training failed")
    text = out.getvalue()
    assert secret not in text and json.dumps(secret)[1:-1] not in text, text
    assert "whoami?token=*** (abc)" in text and "RuntimeError: token=***" in text, text


def test_redact_masks_longer_values_first_and_keeps_short_ones() -> None:
    assert redact("key=abcdef, part=abcd, pin=123", ["abcd", "abcdef", "123", None]) == (
        "key=***, part=***, pin=123"
    )


def test_hivemind_and_lightning_log_once_through_our_handler(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    from hivemind.utils.logging import get_logger

    noisy = get_logger("hivemind.averaging.averager")
    noisy.info("averaged with 2 peers")  # below hivemind's default level here
    noisy.warning("averaging timed out")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False")
    assert [json.loads(line)["message"] for line in out.getvalue().splitlines()] == [
        "averaging timed out",
        "GPU available: False",
    ]
    assert not logging.getLogger("lightning").handlers  # Lightning's own console handler is gone


# -- metrics ------------------------------------------------------------------------------------------


def test_route_templates_are_full_and_bounded() -> None:
    def scope(path: str, template: str | None) -> dict[str, object]:
        return {"path": path, "route": SimpleNamespace(path=template) if template else None}

    assert route_template(scope(api.run("digits"), "/runs/{name}")) == "/api/v1/runs/{name}"
    assert route_template(scope(api.heartbeat("12"), "/workers/{worker_id}/heartbeat")) == (
        "/api/v1/workers/{worker_id}/heartbeat"
    )
    assert route_template(scope("/", "/")) == "/"
    assert route_template(scope("/metrics", "/metrics")) == "/metrics"
    assert route_template(scope("/no/such/thing", None)) == "unmatched"


def test_each_app_has_its_own_registry() -> None:
    first, second = ServiceMetrics(), ServiceMetrics()  # the global registry would refuse the second
    first.heartbeats.labels("accepted").inc()
    parsed = {
        (s.name, s.labels.get("result")): s.value
        for f in text_string_to_metric_families(generate_latest(second.registry).decode())
        for s in f.samples
    }
    assert parsed[("spotswarm_heartbeats_total", "accepted")] == 0  # nothing counted in the other app
    assert b'spotswarm_heartbeats_total{result="accepted"} 1.0' in generate_latest(first.registry)


def test_launches_and_failures_are_counted_per_launcher(tmp_path: Path) -> None:
    metrics = ServiceMetrics()
    local = LocalLauncher(tmp_path, command=["sh", "-c", "exit 3"], grace_s=1)
    counted = metrics.count_launches({"local": local})["local"]
    counted.launch(LaunchRequest("req-1", "run-a", {}))
    with pytest.raises(LauncherConfigError):
        counted.launch(LaunchRequest("req-2", "run-a", {}, {"instance_type": "x"}))
    failures: list[object] = []

    def reported() -> bool:
        failures.extend(counted.poll_errors())
        return bool(failures)

    wait_until(reported, 10, message="exit 3 reported")
    assert metrics.launches.labels("local")._value.get() == 1
    assert metrics.launch_failures.labels("local", "rejected")._value.get() == 1
    assert metrics.launch_failures.labels("local", "reported")._value.get() == 1
    counted.terminate("req-1")
    counted.terminate("req-1")  # the loop repeats itself until the worker is gone: one termination
    assert metrics.terminations.labels("local")._value.get() == 1


# -- worker logs ----------------------------------------------------------------------------------------


def test_log_tail_is_bounded_and_starts_at_a_line(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_bytes(b"alpha\nbravo\ncharlie\n")
    assert read_tail(log, 1 << 20).text == "alpha\nbravo\ncharlie\n"
    cut = read_tail(log, 10)
    assert (cut.text, cut.offset, cut.truncated, cut.size_bytes) == ("charlie\n", 12, True, 20)
    assert read_tail(log, 14).text == "bravo\ncharlie\n"  # starts exactly at a line: kept whole
    with pytest.raises(NotFound):
        read_tail(tmp_path / "absent.log", 10)


def test_only_local_workers_have_their_log_on_the_orchestrator(tmp_path: Path) -> None:
    assert worker_log_path(tmp_path, 1, "local", False, "req-9") == tmp_path / "workers" / "req-9.log"
    with pytest.raises(Conflict, match="by hand"):
        worker_log_path(tmp_path, 2, "manual", True, "manual-1")
    with pytest.raises(Conflict, match="docker logs"):
        worker_log_path(tmp_path, 3, "ec2", False, "req-3")
