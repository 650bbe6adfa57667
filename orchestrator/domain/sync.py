"""The sync mode a new run is stored with: the one its spec names, else DiLoCo (``NEW_RUN_SYNC``).

The mode decides what a swarm epoch is (``target_batch_size`` samples in ``"gradients"``, a round in
``"diloco"``), so it is written into the run's ``strategy_options`` at creation: a later change of the
default never changes what a stored run does. A spec that names no mode but asks for something only
another mode gives (a stop condition in samples, an option of hivemind's gradient optimizer) is refused
with the fix, rather than silently counted or ignored in the default mode.
"""

from __future__ import annotations

from orchestrator.errors import InvalidRequest
from worker.protocol.runs import RunSpec
from worker.protocol.sync import DEFAULT_SYNC, NEW_RUN_SYNC, NOT_WITH_DILOCO

SYNC_OPTION = "sync"


def sync_of(strategy_options: dict[str, object] | None) -> str:
    """A stored run's sync mode: the one its options name; a run stored before runs were given one trains
    in ``DEFAULT_SYNC`` (``"gradients"``), the strategy's own default."""
    return str((strategy_options or {}).get(SYNC_OPTION) or DEFAULT_SYNC)


def with_sync(spec: RunSpec) -> RunSpec:
    """``spec`` with its sync mode named; raises :class:`InvalidRequest` where a spec without one asks
    for what the default mode does not do."""
    options = spec.strategy_options
    if options.get(SYNC_OPTION) is not None:
        return spec
    keep = "set strategy_options.sync to 'gradients' for hivemind's gradient averaging"
    if spec.stop.target_samples is not None:
        raise InvalidRequest(
            f"stop.target_samples needs a sync mode: new runs train with sync={NEW_RUN_SYNC!r}, whose swarm "
            f"epochs are averaging rounds, not target_batch_size samples. Give stop.target_epochs "
            f"(rounds), or {keep}, whose epochs are target_batch_size samples"
        )
    gradient_only = sorted(key for key in NOT_WITH_DILOCO if options.get(key))
    if gradient_only:
        raise InvalidRequest(
            f"strategy_options.{gradient_only[0]} needs a sync mode: new runs train with "
            f"sync={NEW_RUN_SYNC!r}, where it does not apply (the module's own optimizer steps every "
            f"batch). Remove it, or {keep}"
        )
    return spec.model_copy(update={"strategy_options": {**options, SYNC_OPTION: NEW_RUN_SYNC}})
