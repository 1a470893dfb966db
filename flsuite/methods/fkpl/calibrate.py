"""FKPL's Stage II as a phase (`Calibrate`, PCC, spec §1.4–1.8): F = the concatenated frozen experts; the prototype and
virtual-feature exchanges (`flsuite.methods.fkpl.prototypes`), the server head or the federated-head control
(`flsuite.methods.fkpl.head`), head ∘ F evaluated per domain, and the run's cost per stage
(`flsuite.methods.fkpl.costs`).

Resume: the phase is finished when its record is in the history; each exchange's reduced answer is checkpointed as
soon as the server has it (`RunContext.query_once`); the head fit is recomputed from its derived seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from flsuite import records
from flsuite.data.base import Split
from flsuite.federation.phases import Phase, Rounds
from flsuite.federation.server_context import ServerContext
from flsuite.federation.state import FederationState, QueryAnswer
from flsuite.federation.task import Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl.clustering import Clusters, committed
from flsuite.methods.fkpl.costs import CalibrationCost, ClusterCost, CostTable, EncoderCost, cost_summary, scalars
from flsuite.methods.fkpl.experts import Experts, expert_cost
from flsuite.methods.fkpl.head import FederatedHead, fit_head, personal_heads
from flsuite.methods.fkpl.model import ConcatExperts, ConcatModel, encoder_weights, head_keys
from flsuite.methods.fkpl.prototypes import (
    DomainPrototypes,
    PrototypeQuery,
    VirtualFeatureQuery,
    VirtualFeatures,
    domain_prototypes,
    pool_features,
)
from flsuite.methods.fkpl.settings import CalibrationSettings
from flsuite.metrics import evaluate_federation
from flsuite.models.representation import check_contract

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext


@dataclass(frozen=True)
class FrozenExperts:
    """What Stage II starts from: each client's cluster (Stage 0), the experts (Stage I) and F's weights (their
    encoders, "experts.v.<key>")."""

    labels: list[int]
    experts: Experts
    encoder: Weights

    @property
    def count(self) -> int:
        """V."""
        return max(self.labels) + 1


@dataclass(frozen=True)
class Exchanges:
    """The server head's two client exchanges, as answered (bytes, seconds) and read (the typed reductions)."""

    prototypes: QueryAnswer
    virtual: QueryAnswer

    @property
    def domain(self) -> DomainPrototypes:
        return DomainPrototypes.read(self.prototypes.value)

    @property
    def features(self) -> VirtualFeatures:
        return VirtualFeatures.read(self.virtual.value)

    def cost(self, clients: int, head_fit_s: float) -> CalibrationCost:
        domain, x = self.domain, self.features.x
        return CalibrationCost(
            prototype_scalars_up=domain.scalars_up,
            domain_prototype_scalars_down=clients * int(domain.has.sum()) * x.shape[1],
            virtual_scalars_up=scalars(x),
            num_virtual=len(self.features.y),
            bytes_up=self.prototypes.bytes_up + self.virtual.bytes_up,
            bytes_down=self.prototypes.bytes_down + self.virtual.bytes_down,
            prototypes_s=self.prototypes.seconds,
            virtual_s=self.virtual.seconds,
            head_fit_s=head_fit_s,
        )


class Calibrate(Phase):
    """Stage II: F = concatenated frozen experts; prototypes → domain prototypes → virtual features → server head (PCC),
    or the federated-head control; evaluates head ∘ F per domain and records the run's cost per stage. Reads the
    outputs of the phases `clusters` (Stage 0) and `experts` (Stage I)."""

    def __init__(self, settings: CalibrationSettings, name: str, clusters: str, experts: str) -> None:
        self.settings, self.name, self.clusters, self.experts = settings, name, clusters, experts

    def run(self, ctx: RunContext) -> None:
        frozen = self.frozen(ctx)
        table = self.costs_before(ctx, frozen)
        if self.settings.head == "federated":
            ctx.run_nested(self.federated_head(ctx, frozen), inside=self.name)
        elif committed(ctx, self.name):  # resumed after the head's record: nothing left to do
            return
        else:
            table = self.server_head(ctx, frozen, table)
        ctx.tracker.add_setup(table.setup())

    def frozen(self, ctx: RunContext) -> FrozenExperts:
        """F from Stage I's experts (their heads dropped) and Stage 0's clusters."""
        experts = Experts.read(ctx, self.experts)
        with torch.random.fork_rng(devices=[]):
            dropped = head_keys(ctx.settings.model.build(ctx.data.input_shape, ctx.data.num_classes))
        return FrozenExperts(
            Clusters.read(ctx, self.clusters).labels, experts, encoder_weights(experts.weights, dropped)
        )

    def costs_before(self, ctx: RunContext, frozen: FrozenExperts) -> CostTable:
        """Stages 0 and I from what they committed, and F sent to every client once (M·V·P_f)."""
        stage0 = ClusterCost.read(ctx.records(self.clusters)[0], ctx.timings(self.clusters)[0])
        return CostTable(
            stage0, expert_cost(ctx, frozen.experts), EncoderCost.of(len(ctx.data.clients), frozen.encoder)
        )

    def federated_head(self, ctx: RunContext, frozen: FrozenExperts) -> Rounds:
        """The Table-5 control: rounds of FedAvg over the head only, F frozen, metrics under "head/"."""
        model = ConcatExperts(ctx.settings.model, frozen.count, frozen.encoder)
        rounds = self.settings.head_rounds
        return Rounds(
            name=f"{self.name}/head",
            rounds=rounds,
            model=model,
            method=FederatedHead("samples"),
            server_steps=[],
            prefix=records.FKPL_HEAD_PREFIX,
        )

    def server_head(self, ctx: RunContext, frozen: FrozenExperts, table: CostTable) -> CostTable:
        """PCC: the two exchanges, the server head, head ∘ F evaluated; commits the phase's record (with the costs)."""
        exchanges = self.exchange(ctx, frozen)
        features = exchanges.features
        t0 = time.perf_counter()
        server = ctx.server_context(0)
        head, loss = fit_head(
            server, Split(features.x, features.y), ctx.data.num_classes, self.settings, purpose="fkpl/head"
        )
        t_head = time.perf_counter() - t0
        metrics = self.evaluate(ctx, server, frozen, head, features)
        ctx.publish(self.name, {"head": head})
        table = replace(table, calibration=exchanges.cost(len(ctx.data.clients), t_head))
        found = {records.FKPL_HEAD_LOSS: loss, records.FKPL_FEATURE_DIM: int(features.x.shape[1])}
        record = records.record(1, metrics, found, table.counts(), phase=self.name)
        ctx.commit(record, records.record(1, table.times(), phase=self.name), checkpoint=True)
        return table

    def exchange(self, ctx: RunContext, frozen: FrozenExperts) -> Exchanges:
        """Local prototypes up → domain prototypes down → virtual features up, each answered once, F sent with both."""
        ctx.use(ConcatExperts(ctx.settings.model, frozen.count, with_head=False), FedAvg())
        labels, num_classes = frozen.labels, ctx.data.num_classes
        protos = ctx.query_once(
            self.name,
            "prototypes",
            PrototypeQuery(),
            lambda o: domain_prototypes(o, labels, num_classes),
            weights=frozen.encoder,
        )
        broadcast = DomainPrototypes.read(protos.value).broadcast(labels)
        query = VirtualFeatureQuery.of(self.settings)
        virtual = ctx.query_once(
            self.name, "virtual", query, lambda o: pool_features(o, labels), broadcast=broadcast, weights=frozen.encoder
        )
        return Exchanges(protos, virtual)

    def evaluate(
        self, ctx: RunContext, server: ServerContext, frozen: FrozenExperts, head: Weights, features: VirtualFeatures
    ) -> dict[str, Any]:
        """head ∘ F per domain (and the personalised heads when asked)."""
        model = ConcatExperts(ctx.settings.model, frozen.count, frozen.encoder).build(
            ctx.data.input_shape, ctx.data.num_classes
        )
        check_contract(model).head.load_state_dict(head)
        metrics: dict[str, Any] = evaluate_federation(model, ctx.data, device=ctx.settings.eval_device)
        if self.settings.personalized_heads:
            assert isinstance(model, ConcatModel)
            metrics.update(personal_heads(server, model, ctx.data, features, frozen.labels, self.settings))
        return metrics

    def summary_extras(self, state: FederationState) -> dict[str, Any]:
        """Tables 9–10 in summary.json: the per-stage counts of this phase's record (wall times: timings.jsonl)."""
        record: dict[str, Any] = next((r for r in reversed(state.history) if r.get(records.PHASE) == self.name), {})
        return cost_summary(record)

    def summary_records(self, history) -> list[dict[str, Any]]:
        if self.settings.head == "federated":
            return [
                records.without_prefix(r, records.FKPL_HEAD_PREFIX)
                for r in history
                if r.get(records.PHASE) == f"{self.name}/head"
            ]
        return [r for r in history if r.get(records.PHASE) == self.name]
