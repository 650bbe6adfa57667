"""Which bind addresses count as loopback for the plain-HTTP warning of ``spotswarm serve``, and which
``Host`` headers the API answers (the rest get 400: DNS rebinding)."""

from __future__ import annotations

import pytest

from orchestrator.api.middleware.trusted_hosts import host_allowed
from orchestrator.cli.http_server import is_loopback
from orchestrator.config import Settings


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_tls(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "orchestrator.example.com", ""])
def test_every_other_host_may_be_reached_from_the_network(host: str) -> None:
    assert not is_loopback(host)


# -- which Host headers the API answers (DNS rebinding) ---------------------------------------------------


def test_the_allowed_hosts_are_loopback_the_published_names_and_the_configured_ones() -> None:
    default = Settings(host="127.0.0.1", public_url=None, trusted_hosts=[])
    assert default.allowed_hosts() == ["localhost", "127.0.0.1"]
    published = Settings(
        host="0.0.0.0", public_url="http://orch.internal:8000", trusted_hosts=["Api.Example.com"]
    )
    assert published.allowed_hosts() == ["localhost", "api.example.com", "orch.internal"]


@pytest.mark.parametrize(
    "header",
    [None, "localhost", "localhost:8000", "LOCALHOST.:8000", "127.0.0.1:8000", "[::1]:8000", "10.0.0.5",
     "api.example.com", "eu.corp.example:443"],
)  # fmt: skip
def test_loopback_addresses_and_configured_names_are_served(header: str | None) -> None:
    assert host_allowed(header, ["localhost", "api.example.com", "*.corp.example"])


@pytest.mark.parametrize(
    "header", ["rebind.attacker.example", "rebind.attacker.example:8000", "localhost.attacker.example",
               "api.example.com.attacker.example", "corp.example", "", "127.0.0.1.nip.io"],
)  # fmt: skip
def test_any_other_name_is_refused(header: str) -> None:
    assert not host_allowed(header, ["localhost", "api.example.com", "*.corp.example"])


def test_a_star_serves_every_name() -> None:
    assert host_allowed("anything.example", ["*"])
