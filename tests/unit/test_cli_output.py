"""The CLI's text output: tables, the text chart, error details, and the spec flags."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.cli.client import CliError, _read_config
from orchestrator.cli.output import fmt_duration, format_table, text_chart
from orchestrator.cli.runs import build_spec
from orchestrator.cli.workers import worker_row
from orchestrator.sizes import fmt_bytes
from worker.protocol.errors import MAX_DETAIL_CHARS
from worker.protocol.errors import error_detail as _detail


def test_table_aligns_numbers_right_and_shows_missing_as_dash() -> None:
    table = format_table(["name", "loss"], [["a", 0.5], ["bbb", None], ["cc", 12.25]])
    assert table.splitlines() == ["NAME   LOSS", "a       0.5", "bbb       -", "cc    12.25"]


def test_text_chart_has_fixed_height_labels_and_width() -> None:
    chart = text_chart([float(v) for v in range(200)], width=40, height=5, unicode=True)
    lines = chart.splitlines()
    # 200 values in 40 columns: each column is the mean of 5, so the labels are 197 and 2
    assert len(lines) == 5 and lines[0].startswith("197 |") and lines[-1].startswith("  2 |")
    assert len(lines[-1].split("|", 1)[1]) == 40
    assert text_chart([], unicode=True) == "(no data)"
    assert "#" in text_chart([1.0, 1.0], unicode=False)  # flat series still draws


def test_formatting_helpers() -> None:
    assert [fmt_duration(s) for s in (5, 93, 7300, 90000, None)] == ["5s", "1m33s", "2h01m", "1d1h", "-"]
    assert [fmt_bytes(b) for b in (12, 2048, 5 << 30)] == ["12 B", "2.0 KiB", "5.0 GiB"]


def test_server_details_become_one_line_listing_every_validation_error() -> None:
    validation = httpx.Response(
        422,
        json={"detail": [{"loc": ["body", "name"], "msg": "bad name"}, {"loc": ["body", "x"], "msg": "y"}]},
    )
    assert _detail(validation) == "name: bad name; x: y"
    missing = [{"type": "missing", "loc": ["body", f], "msg": "Field required"} for f in ("a", "b")]
    value = {"type": "value_error", "loc": ["body"], "msg": "Value error, min_workers (3) > max_workers (2)"}
    both = httpx.Response(422, json={"detail": [value, *missing]})
    assert _detail(both) == "missing fields: a, b; min_workers (3) > max_workers (2)"
    assert _detail(httpx.Response(404, json={"detail": "run 'x' not found"})) == "run 'x' not found"
    assert _detail(httpx.Response(502, text="<html>bad gateway</html>")) == "<html>bad gateway</html>"
    assert str(CliError("two\nlines  here")) == "two lines here"


def test_a_long_server_error_is_shown_whole_and_a_giant_one_cut_with_a_mark() -> None:
    words = "because there is no version of einops==99.0 and you require einops==99.0, we can conclude"
    long = f"requirements: uv install failed (exit 1): {words} that your requirements are unsatisfiable."
    assert len(long) > 150 and _detail(httpx.Response(422, json={"detail": long * 5})) == long * 5
    giant = _detail(httpx.Response(502, text="word " * 2000))
    assert len(giant) < MAX_DETAIL_CHARS + 60 and giant.endswith(" more characters left out)")
    assert giant.split(" … (")[0].endswith("word")  # cut at a word's end, and said so
    assert int(giant.split(" … (")[1].split()[0]) == len("word " * 2000) - len(giant.split(" … (")[0])


def test_sizes_read_alike_everywhere() -> None:
    assert [fmt_bytes(b) for b in (None, 0, 1023, 33178, 1 << 20, 5 << 40)] == [
        "-",
        "0 B",
        "1023 B",
        "32.4 KiB",
        "1.0 MiB",
        "5.0 TiB",
    ]


def test_spec_flags_override_the_file(tmp_path: Any) -> None:
    path = tmp_path / "spec.json"
    path.write_text(
        '{"name": "a", "desired_workers": 1, "stop": {"target_samples": 5}, "module_args": {"x": 1}}'
    )
    flags = {"workers": 3, "target_epochs": 2, "module_arg": ("y=[1, 2]", "z=text"), "name": None}
    spec = build_spec(str(path), flags)
    assert spec["name"] == "a" and spec["desired_workers"] == 3
    assert spec["stop"] == {"target_samples": 5, "target_epochs": 2}
    assert spec["module_args"] == {"x": 1, "y": [1, 2], "z": "text"}
    with pytest.raises(CliError):
        build_spec(None, {"module_arg": ("novalue",)})


def test_the_config_file_is_toml_whose_keys_are_strings(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('# c\nurl = "http://h:1"\n\ntoken="t#1"\n')
    assert _read_config(path) == {"url": "http://h:1", "token": "t#1"}
    path.write_text("url = 1\n")
    with pytest.raises(CliError, match="'url' must be a string"):
        _read_config(path)
    assert _read_config(tmp_path / "absent.toml") == {}


def test_the_demo_shows_the_admin_token_on_a_terminal_only() -> None:
    from orchestrator.cli.demo import token_shown

    path = Path("data/demo/admin_token")
    assert token_shown("ssa_secret", path, on_terminal=True).startswith("ssa_secret  (")
    redirected = token_shown("ssa_secret", path, on_terminal=False)
    assert "ssa_secret" not in redirected and "cat data/demo/admin_token" in redirected


def test_workers_list_counts_a_workers_epochs_not_its_group_sizes_or_seconds() -> None:
    counts = {"averaged": 9, "alone": 1, "group_size_sum": 18, "train_s": 120.5, "averaging_s": 6.0}
    worker = {"id": 1, "state": "running", "samples": 0, "averaged_fraction": 0.9, "averaging": counts}
    assert "90% of 10" in worker_row(worker, datetime.now(UTC))
