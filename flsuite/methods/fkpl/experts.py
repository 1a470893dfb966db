"""FKPL's Stage I as a phase (`TrainExperts`): one FedAvg `Rounds` per cluster of Stage 0, what it publishes
(`Experts`) and its cost (`expert_cost`).

Resume: each expert runs as a nested phase (`RunContext.run_nested`), checkpointed per round like any run, so a kill
resumes inside the expert it hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flsuite import records
from flsuite.federation.phases import Phase, Rounds
from flsuite.federation.task import Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl.clustering import Clusters
from flsuite.methods.fkpl.costs import ExpertCost
from flsuite.methods.fkpl.model import SeededInit
from flsuite.methods.fkpl.settings import ExpertSettings
from flsuite.seeding import derive_seed

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext


@dataclass(frozen=True)
class Experts:
    """What Stage I publishes: expert v's phase name and final weights (encoder and head) at index v."""

    phases: list[str]
    weights: list[Weights]

    def published(self) -> dict[str, list]:
        return {"phases": self.phases, "weights": self.weights}

    @classmethod
    def read(cls, ctx: RunContext, phase: str) -> Experts:
        """What phase `phase` (Stage I) published."""
        out = ctx.outputs(phase)
        return cls(list(out["phases"]), list(out["weights"]))


class TrainExperts(Phase):
    """Stage I: one FedAvg `Rounds` per cluster of the phase `clusters` over its members (sample-weighted; a singleton
    trains alone), expert v's metrics under "expert<v>/". Each expert phase starts like a run of its own: with
    `expert_init: shared` every expert starts from the run's one `model_init` draw (the official code's
    `encoder_global_para = [encoder_list[0].state_dict() for i in range(num_K)]`), so a one-cluster Stage I is a plain
    FedAvg run on those clients, bit for bit; with `independent` expert v starts from its own draw (`SeededInit`, seed
    derived from (seed, cluster v))."""

    def __init__(self, settings: ExpertSettings, name: str, clusters: str) -> None:
        self.settings, self.name, self.clusters = settings, name, clusters

    def expert(self, ctx: RunContext, v: int, group: list[int]) -> Rounds:
        seed = derive_seed(ctx.settings.seed, purpose=f"fkpl/expert{v}/model_init")
        model = SeededInit(ctx.settings.model, seed) if self.settings.expert_init == "independent" else None
        return Rounds(
            name=f"{self.name}/expert{v}",
            rounds=self.settings.expert_rounds,
            clients=group,
            model=model,
            method=FedAvg("samples"),
            server_steps=[],
            prefix=records.fkpl_expert_prefix(v),
        )

    def run(self, ctx: RunContext) -> None:
        experts = self.experts(ctx)
        for phase in experts:
            ctx.run_nested(phase, inside=self.name)
        ctx.publish(
            self.name, Experts([p.name for p in experts], [ctx.outputs(p.name)["weights"] for p in experts]).published()
        )

    def experts(self, ctx: RunContext) -> list[Rounds]:
        """One FedAvg phase per cluster of Stage 0."""
        return [self.expert(ctx, v, group) for v, group in enumerate(Clusters.read(ctx, self.clusters).members)]


def expert_cost(ctx: RunContext, experts: Experts) -> ExpertCost:
    """Stage I's cost from the round records and timings the engine wrote for each expert, under its prefix."""
    prefixes = [records.fkpl_expert_prefix(v) for v in range(len(experts.phases))]
    rounds = [
        records.without_prefix(r, p)
        for name, p in zip(experts.phases, prefixes, strict=True)
        for r in ctx.records(name)
    ]
    timings = [
        records.without_prefix(t, p)
        for name, p in zip(experts.phases, prefixes, strict=True)
        for t in ctx.timings(name)
    ]
    return ExpertCost.of(rounds, timings, experts.weights)
