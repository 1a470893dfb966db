"""A run's final summary: the last-k statistics of the records the protocol's last reporting phase wrote
(`Phase.summary_records`: the rounds, or a calibration phase's own), each query's totals and what each phase adds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flsuite.federation.phases import Phase
from flsuite.federation.state import FederationState
from flsuite.metrics import final_summary
from flsuite.records import QUERY_PREFIX


def run_summary(
    protocol: Sequence[Phase], state: FederationState, last_k: int, target_acc: float | None
) -> tuple[dict[str, object], Sequence[Mapping[str, object]]]:
    """(summary, the records it summarises): the last phase with records reports (a later phase's records win)."""
    records = next((r for r in (p.summary_records(state.history) for p in reversed(protocol)) if r), [])
    summary = final_summary(records, last_k, target_acc)
    for name, totals in state.queries.items():
        summary.update({f"{QUERY_PREFIX}{name}/{k}": v for k, v in totals.as_record().items()})
    for phase in protocol:
        summary.update(phase.summary_extras(state))
    return summary, records
