"""Which bind addresses count as loopback for the plain-HTTP warning of ``spotswarm serve``."""

from __future__ import annotations

import pytest

from orchestrator.cli.http_server import is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_tls(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "orchestrator.example.com", ""])
def test_every_other_host_may_be_reached_from_the_network(host: str) -> None:
    assert not is_loopback(host)
