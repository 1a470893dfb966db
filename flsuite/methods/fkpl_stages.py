"""FKPL's Stage 0 (clustering) and Stage I (experts) phases and what every FKPL phase shares; Stage II is in
`flsuite.methods.fkpl_calibrate`. The method, its options and the equations are in `flsuite.methods.fkpl`.

Resume: a phase is finished when its record is in the history. Inside a phase, a client query's answer is kept in
`outputs[<phase>]` and checkpointed as soon as the server has reduced it (prototypes, pooled virtual features), and the
query's byte counters are rolled back if the run is interrupted before that, so a resumed run neither asks again nor
counts twice. Stage I runs one `Rounds` per cluster, each checkpointed per round like any run; Stage II's head fit is
recomputed from its derived seed.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from flsuite.federation.phases import Phase, Rounds, RunContext
from flsuite.federation.query import ClientQuery, QueryOutcome
from flsuite.federation.task import Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl_cluster import SubspaceBasis, angle_matrix, cluster, default_scan, members, plot_angles, purity, threshold_scan

if TYPE_CHECKING:
    from flsuite.methods.fkpl import FKPL


def scalars(obj: Any) -> int:
    """Floating-point scalars in a payload (Table 9 counts scalars; labels and indices are not counted)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() if torch.is_floating_point(obj) else 0
    if isinstance(obj, dict):
        return sum(scalars(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(scalars(v) for v in obj)
    return 0


class FKPLPhase(Phase):
    """Shared by the three phases: the method's settings, the phase's scratch outputs, once-only queries."""

    def __init__(self, fkpl: FKPL, name: str) -> None:
        self.fkpl, self.name = fkpl, name

    def done(self, ctx: RunContext) -> bool:
        return any(r.get("phase") == self.name for r in ctx.state.history)

    def scratch(self, ctx: RunContext) -> dict[str, Any]:
        return ctx.state.outputs.setdefault(self.name, {})

    def query_once(self, ctx: RunContext, key: str, query: ClientQuery, reduce: Callable[[QueryOutcome], Any], **kwargs: Any) -> Any:
        """Ask the clients once: the reduced answer, its time and bytes are stored under `key` and checkpointed."""
        scratch = self.scratch(ctx)
        if key not in scratch:
            before = copy.deepcopy(ctx.state.outputs.get("queries", {}))
            t0 = time.perf_counter()
            try:
                outcome = ctx.query(query, **kwargs)
                value = reduce(outcome)
            except BaseException:
                ctx.state.outputs["queries"] = before  # an unfinished exchange is not counted
                raise
            scratch[key] = {"value": value, "seconds": time.perf_counter() - t0, "bytes_up": outcome.bytes_up, "bytes_down": outcome.bytes_down}
            ctx.checkpoint()
        return scratch[key]


# ---- Stage 0 -----------------------------------------------------------------------------------------------------
class ClusterClients(FKPLPhase):
    """Stage 0: subspace bases → principal angles → average-linkage clusters (or a fixed assignment for controls)."""

    def run(self, ctx: RunContext) -> None:
        if self.done(ctx):
            return
        f, m = self.fkpl, len(ctx.data.clients)
        domains = [c.domain for c in ctx.data.clients]
        angles, up, up_scalars, t_pre = None, 0, 0, 0.0
        t0 = time.perf_counter()
        if f.assignment == "subspace":

            def reduce(outcome: QueryOutcome) -> dict[str, Any]:
                bases = [outcome.uploads()[k]["basis"] for k in range(m)]
                return {"angles": torch.tensor(angle_matrix(bases, f.angle)), "scalars": scalars(bases)}

            answer = self.query_once(ctx, "bases", SubspaceBasis(f.basis, f.per_class), reduce)
            angles, up, up_scalars, t_pre = answer["value"]["angles"].numpy(), answer["bytes_up"], answer["value"]["scalars"], answer["seconds"]
            t0 = time.perf_counter()
            labels = cluster(angles, f.threshold)
        elif f.assignment == "domains":
            order: dict[str, int] = {}
            labels = [order.setdefault(d, len(order)) for d in domains]
        else:
            labels = [0] * m
        t_cluster = time.perf_counter() - t0
        result: dict[str, Any] = {"labels": labels, "clusters": members(labels), "purity": purity(labels, domains), "domains": domains}
        if angles is not None:
            result["angles"] = torch.tensor(angles)
            result["scan"] = threshold_scan(angles, domains, default_scan(angles, f.threshold))
            plot_angles(angles, domains, labels, ctx.run_dir / "fkpl_angles.png")
        ctx.state.outputs[self.name] = result
        (ctx.run_dir / "fkpl_clusters.json").write_text(
            json.dumps({k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in result.items()}, indent=1) + "\n"
        )
        record = {
            "round": 0,
            "phase": self.name,
            "cluster/num_clusters": max(labels) + 1,
            "cluster/purity": result["purity"],
            "cluster/threshold": f.threshold,
            "cluster/labels": labels,
            "bytes_up": up,
            "scalars_up": up_scalars,
        }
        timing = {"round": 0, "phase": self.name, "time/preprocess_s": t_pre, "time/cluster_s": t_cluster}
        ctx.commit(record, timing, checkpoint=True)


# ---- Stage I -----------------------------------------------------------------------------------------------------
class TrainExperts(FKPLPhase):
    """Stage I: one FedAvg `Rounds` per cluster over its members (sample-weighted; a singleton trains alone), expert
    v's metrics under "expert<v>/". Each expert phase starts like a run of its own, so a one-cluster Stage I is a plain
    FedAvg run on those clients, bit for bit."""

    def expert(self, v: int, group: list[int]) -> Rounds:
        return Rounds(name=f"{self.name}/expert{v}", rounds=self.fkpl.expert_rounds, clients=group, method=FedAvg("samples"), server_steps=[], prefix=f"expert{v}/")

    def run(self, ctx: RunContext) -> None:
        state, scratch = ctx.state, self.scratch(ctx)
        for v, group in enumerate(ctx.state.outputs[self.fkpl.names[0]]["clusters"]):
            phase = self.expert(v, group)
            if phase.name in state.outputs:
                continue
            if scratch.get("current") != v:  # a fresh expert (not one resumed mid-way)
                state.round, state.global_weights, state.server_state, state.client_states, state.step_states = 0, {}, {}, {}, []
                scratch["current"] = v
            phase.run(ctx)
            ctx.checkpoint()  # Rounds stores its outputs after its last checkpoint

    def weights(self, ctx: RunContext) -> list[Weights]:
        return [ctx.state.outputs[f"{self.name}/expert{v}"]["weights"] for v in range(len(ctx.state.outputs[self.fkpl.names[0]]["clusters"]))]
