"""The one rule that keeps a run's ``secret_env`` values out of what is stored, logged or shown.

Both sides apply it: the worker to every message and log line it writes once it knows the run's secrets
(the first line of a user's exception often quotes a credential, e.g. an HTTP error whose URL carries
``?token=...``), and the orchestrator to everything a worker sends, with the run's own values, before
it stores or logs it: a hand-written worker may not redact.
"""

from __future__ import annotations

from collections.abc import Iterable

MASK = "***"
# Shorter values would mask ordinary words and numbers all over a message, and are no credential.
MIN_SECRET_CHARS = 4


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret value of ``MIN_SECRET_CHARS`` characters or more replaced by ``***``.

    Longer values go first, so a secret that contains another is masked whole.
    """
    values = {s for s in secrets if s is not None and len(s) >= MIN_SECRET_CHARS}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
