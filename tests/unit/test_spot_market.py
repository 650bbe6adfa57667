"""The simulated spot market's arithmetic: traces read (Parcae's JSON lines, its CSV, a CSV by the
minute), capacity scaled to the slots and run time-compressed on a clock the test moves, the seeded draw
of reclaimed workers, the seeded random market, and a followed trace that grows while it runs."""

from __future__ import annotations

import random
from pathlib import Path

import click
import pytest

from orchestrator.cli.serve import check_spot_market
from orchestrator.config import Settings
from orchestrator.launchers.spot_local import load_market_settings
from orchestrator.launchers.spot_market import (
    SpotMarket,
    SpotMarketError,
    SpotMarketSettings,
    parse_trace,
    random_schedule,
)

PARCAE_EXCERPT = Path(__file__).parents[1] / "data" / "parcae" / "bert_trace_hh_55_65_head11.txt"


class FakeClock:
    """Wall seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_parcae_trace_counts_the_nodes_its_add_and_remove_lines_list() -> None:
    schedule = parse_trace(PARCAE_EXCERPT.read_text())
    assert schedule[0] == (0.0, 32)
    assert schedule[7] == (420.0, 32)  # no-op lines keep the fleet
    assert schedule[8] == (480.0, 29)  # three nodes removed
    assert schedule[-1] == (600.0, 26)


def test_capacity_is_scaled_to_the_slots_and_runs_compressed() -> None:
    clock = FakeClock()
    market = SpotMarket(SpotMarketSettings(slots=8, trace=PARCAE_EXCERPT, compress=60.0), clock)
    assert not market.started
    clock.now += 50.0  # the trace waits for the first look (the first launch)
    assert market.capacity() == 8
    assert market.started
    clock.now += 7.9  # trace 474 s
    assert market.capacity() == 8
    clock.now += 0.1  # trace 480 s: 29 of 32 nodes
    assert market.capacity() == round(8 * 29 / 32) == 7
    clock.now += 2.0  # trace 600 s: 26 of 32
    assert market.capacity() == round(8 * 26 / 32)
    assert market.trace_s() == pytest.approx(600.0)
    assert market.notice_wall_s() == pytest.approx(2.0)  # EC2's 120 s, 60 times faster


def test_csv_traces_in_parcae_milliseconds_or_by_a_named_unit() -> None:
    assert parse_trace("0,1\n0,2\n780000,30\n") == [(0.0, 1), (0.0, 2), (780.0, 30)]
    assert parse_trace("minute,capacity\n0,4\n3,2\n") == [(0.0, 4), (180.0, 2)]
    with pytest.raises(SpotMarketError, match="unknown time unit"):
        parse_trace("hour,capacity\n0,4\n")
    with pytest.raises(SpotMarketError, match="row 2"):
        parse_trace("minute,capacity\n0,4\n3\n")


def test_an_unknown_event_names_its_line() -> None:
    with pytest.raises(SpotMarketError, match="line 2: unknown event 'grow'"):
        parse_trace('[0, "add", {"nodes": ["a"]}]\n[60000, "grow", {"nodes": ["b"]}]\n')


def test_the_reclaimed_workers_and_kills_are_the_same_for_the_same_seed() -> None:
    def picks(seed: int) -> list[tuple[list[str], bool]]:
        market = SpotMarket(SpotMarketSettings(slots=4, seed=seed, kill_share=0.5), FakeClock())
        workers = [f"w{i}" for i in range(10)]
        return [(market.draw(workers[::-1], 3), market.kill_without_notice()) for _ in range(8)]

    assert picks(7) == picks(7)  # the order the candidates come in does not matter: they are sorted
    assert picks(7) != picks(8)
    assert {kill for _, kill in picks(7)} == {True, False}


def test_the_random_market_is_seeded_and_stays_within_its_nodes() -> None:
    settings = SpotMarketSettings(slots=4, seed=3, random_interval_s=60.0, random_peak_nodes=5)
    first = random_schedule(settings, 3600.0, random.Random(3))
    assert first == random_schedule(settings, 3600.0, random.Random(3))
    assert first[0] == (0.0, 5)
    assert all(0 <= nodes <= 5 for _, nodes in first)
    assert len({nodes for _, nodes in first}) > 1


def test_a_followed_trace_applies_appended_lines_whose_time_has_passed(tmp_path: Path) -> None:
    trace = tmp_path / "live.jsonl"
    trace.write_text('[0, "add", {"nodes": ["a", "b"]}]\n')
    clock = FakeClock()
    market = SpotMarket(SpotMarketSettings(slots=2, trace=trace, follow=True), clock)
    assert market.capacity() == 2
    with trace.open("a") as out:
        out.write('[0, "remove", {"nodes": ["a"]}]\n[0, "remove", {"no')  # the last line half written
    assert market.capacity() == 1
    with trace.open("a") as out:
        out.write('des": ["b"]}]\n')
    assert market.capacity() == 0


def test_a_trace_without_events_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SpotMarketError, match="no events"):
        SpotMarket(SpotMarketSettings(slots=2, trace=empty), FakeClock())


def test_a_market_file_names_its_trace_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("minute,capacity\n0,2\n")
    (tmp_path / "market.json").write_text('{"trace": "trace.csv", "slots": 2, "compress": 10}')
    settings = load_market_settings(tmp_path / "market.json")
    assert settings.trace == tmp_path / "trace.csv"
    assert SpotMarket(settings, FakeClock()).capacity() == 2


def test_serve_refuses_a_bad_market_file_in_one_line(tmp_path: Path) -> None:
    market = tmp_path / "market.json"
    market.write_text('{"trace": "missing.csv", "slots": 2}')
    with pytest.raises(click.ClickException, match="cannot read the trace"):
        check_spot_market(Settings(data_dir=tmp_path, local_spot_market=market))
    market.write_text('{"slots": 0}')
    with pytest.raises(click.ClickException, match="slots"):
        check_spot_market(Settings(data_dir=tmp_path, local_spot_market=market))
