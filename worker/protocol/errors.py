"""How an API error reads: the ``detail`` of the JSON body the orchestrator answers a refusal with, made one
message. Both HTTP clients (the CLI's and the worker agent's) word errors with it.

A validation error (422) lists every field that failed, the missing ones together (``missing fields: a,
b; name: use ... (got 'X')``); a long message is cut at a word's end, saying how much was left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the protocol imports pydantic alone; both clients have httpx
    import httpx

#: the most of a server's error text the CLI prints: a server's own messages fit whole; a proxy's HTML
#: page does not need to (its start says what it is)
MAX_DETAIL_CHARS = 4000


def error_detail(response: httpx.Response, max_chars: int = MAX_DETAIL_CHARS) -> str:
    """The server's ``detail``, whole up to ``max_chars``; validation errors: every one of them (missing
    fields together); a body that is not JSON: its text, or the status's reason phrase."""
    try:
        body = response.json()
    except ValueError:
        return shortened(response.text or response.reason_phrase, max_chars)
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list) and detail and all(isinstance(item, dict) for item in detail):
        return shortened(validation_errors(detail), max_chars)
    return shortened(str(detail), max_chars)


def shortened(text: str, max_chars: int = MAX_DETAIL_CHARS) -> str:
    """``text`` whole when it fits in ``max_chars``, else cut at a word's end with a mark saying how much
    was left out (a cut that does not say so reads as the whole message)."""
    if len(text) <= max_chars:
        return text
    kept = text[:max_chars]
    kept = kept[: kept.rfind(" ")] if " " in kept[max_chars // 2 :] else kept
    return f"{kept.rstrip()} … ({len(text) - len(kept)} more characters left out)"


def validation_errors(errors: list[dict[str, Any]]) -> str:
    """``missing fields: a, b; name: use ... (got 'X')``: every error of a 422, pydantic's prefix removed."""
    missing: list[str] = []
    others: list[str] = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", []) if part != "body")
        if error.get("type") == "missing" and where:
            missing.append(where)
            continue
        message = str(error.get("msg", error)).removeprefix("Value error, ")
        others.append(f"{where}: {message}" if where else message)
    if missing:
        others.insert(0, f"missing field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    return "; ".join(others)
