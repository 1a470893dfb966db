"""FKPL's Stage 0 (clustering) and Stage I (experts) phases and what every FKPL phase shares; Stage II is in
`flsuite.methods.fkpl_calibrate`. The method, its options and the equations are in `flsuite.methods.fkpl`.

Resume: a phase is finished when its record is in the history. Inside a phase, a client query's answer is kept and
checkpointed by the context as soon as the server has reduced it (`RunContext.query_once`: neither asked again nor
counted twice). Stage I runs one `Rounds` per cluster as a nested phase (`RunContext.run_nested`), each checkpointed
per round like any run; Stage II's head fit is recomputed from its derived seed.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import torch

from flsuite import records
from flsuite.federation.phases import Phase, Rounds
from flsuite.federation.query import QueryOutcome
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl_cluster import angle_matrix, cluster, default_scan, members, plot_angles, purity, threshold_scan
from flsuite.methods.fkpl_model import SeededInit
from flsuite.seeding import derive_seed

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext
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
    """Shared by the three phases: the method's settings, whether the phase has committed its record, once-only
    client queries."""

    def __init__(self, fkpl: FKPL, name: str) -> None:
        self.fkpl, self.name = fkpl, name

    def done(self, ctx: RunContext) -> bool:
        return bool(ctx.records(self.name))


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

            answer = ctx.query_once(self.name, "bases", f.subspace_query(), reduce)
            angles, up, up_scalars, t_pre = answer.value["angles"].numpy(), answer.bytes_up, answer.value["scalars"], answer.seconds
            t0 = time.perf_counter()
            labels = cluster(angles, f.threshold, f.linkage)
        elif f.assignment == "domains":
            order: dict[str, int] = {}
            labels = [order.setdefault(d, len(order)) for d in domains]
        else:
            labels = [0] * m
        t_cluster = time.perf_counter() - t0
        result: dict[str, Any] = {"labels": labels, "clusters": members(labels), "purity": purity(labels, domains), "domains": domains}
        if angles is not None:
            result["angles"] = torch.tensor(angles)
            result["scan"] = threshold_scan(angles, domains, default_scan(angles, f.threshold), f.linkage)
            plot_angles(angles, domains, labels, ctx.artifact("fkpl_angles.png"))
        ctx.publish(self.name, result)
        ctx.artifact("fkpl_clusters.json").write_text(
            json.dumps({k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in result.items()}, indent=1) + "\n"
        )
        clustered = {"cluster/num_clusters": max(labels) + 1, "cluster/purity": result["purity"], "cluster/threshold": f.threshold, "cluster/labels": labels}
        record = records.record(0, clustered, records.traffic(up=up), {"scalars_up": up_scalars}, phase=self.name)
        timing = records.record(0, {"time/preprocess_s": t_pre, "time/cluster_s": t_cluster}, phase=self.name)
        ctx.commit(record, timing, checkpoint=True)


# ---- Stage I -----------------------------------------------------------------------------------------------------
class TrainExperts(FKPLPhase):
    """Stage I: one FedAvg `Rounds` per cluster over its members (sample-weighted; a singleton trains alone), expert
    v's metrics under "expert<v>/". Each expert phase starts like a run of its own: with `expert_init: shared` every
    expert starts from the run's one `model_init` draw (the official code's `encoder_global_para =
    [encoder_list[0].state_dict() for i in range(num_K)]`), so a one-cluster Stage I is a plain FedAvg run on those
    clients, bit for bit; with `independent` expert v starts from its own draw (`SeededInit`, seed derived from
    (seed, cluster v))."""

    def expert(self, ctx: RunContext, v: int, group: list[int]) -> Rounds:
        seed = derive_seed(ctx.settings.seed, purpose=f"fkpl/expert{v}/model_init")
        model = SeededInit(ctx.settings.model, seed) if self.fkpl.expert_init == "independent" else None
        return Rounds(
            name=f"{self.name}/expert{v}",
            rounds=self.fkpl.expert_rounds,
            clients=group,
            model=model,
            method=FedAvg("samples"),
            server_steps=[],
            prefix=f"expert{v}/",
        )

    def run(self, ctx: RunContext) -> None:
        experts = self.experts(ctx)
        for phase in experts:
            ctx.run_nested(phase, inside=self.name)
        ctx.publish(self.name, {"phases": [p.name for p in experts], "weights": [ctx.outputs(p.name)["weights"] for p in experts]})

    def experts(self, ctx: RunContext) -> list[Rounds]:
        """One FedAvg phase per cluster of Stage 0."""
        return [self.expert(ctx, v, group) for v, group in enumerate(ctx.outputs(self.fkpl.names[0])["clusters"])]
