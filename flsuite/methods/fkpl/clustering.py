"""FKPL's Stage 0 as a phase (`ClusterClients`): the clients' bases (`flsuite.methods.fkpl.subspace`), their angles
and the clusters (`flsuite.methods.fkpl.cluster`), or a fixed assignment; what it publishes (`Clusters`) and its cost.

Resume: the phase is finished when its record is in the history; the bases' query is answered once
(`RunContext.query_once`: its reduced answer is checkpointed, neither asked again nor counted twice).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from flsuite import records
from flsuite.federation.phases import Phase
from flsuite.federation.query import QueryOutcome
from flsuite.federation.state import QueryAnswer
from flsuite.methods.fkpl.cluster import (
    angle_matrix,
    cluster,
    default_scan,
    members,
    plot_angles,
    purity,
    threshold_scan,
)
from flsuite.methods.fkpl.costs import ClusterCost, scalars
from flsuite.methods.fkpl.settings import ClusterSettings
from flsuite.methods.fkpl.subspace import SubspaceBasis

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext


def committed(ctx: RunContext, phase: str) -> bool:
    """Whether `phase` has committed its record (a one-shot phase is then finished)."""
    return bool(ctx.records(phase))


@dataclass(frozen=True)
class Clusters:
    """What Stage 0 publishes: cluster v of each client (`labels`, clients in id order), the clients' true domains,
    the purity against them, and with subspace clustering the angle matrix (degrees) and the threshold scan."""

    labels: list[int]
    domains: list[str]
    purity: float
    angles: np.ndarray | None = None
    scan: list[dict[str, float]] | None = None

    @property
    def members(self) -> list[list[int]]:
        """Cluster v's clients at index v."""
        return members(self.labels)

    @property
    def count(self) -> int:
        """V."""
        return max(self.labels) + 1

    def published(self) -> dict[str, Any]:
        """As `ctx.publish` keeps it (tensors and plain containers; also fkpl_clusters.json)."""
        out: dict[str, Any] = {
            "labels": self.labels,
            "clusters": self.members,
            "purity": self.purity,
            "domains": self.domains,
        }
        if self.angles is not None:
            out.update(angles=torch.tensor(self.angles), scan=self.scan)
        return out

    @classmethod
    def read(cls, ctx: RunContext, phase: str) -> Clusters:
        """What phase `phase` (Stage 0) published."""
        out = ctx.outputs(phase)
        angles = out["angles"].numpy() if "angles" in out else None
        return cls(list(out["labels"]), list(out["domains"]), out["purity"], angles, out.get("scan"))


class ClusterClients(Phase):
    """Stage 0: subspace bases → principal angles → clusters (or a fixed assignment for the controls)."""

    def __init__(self, settings: ClusterSettings, name: str) -> None:
        self.settings, self.name = settings, name

    def run(self, ctx: RunContext) -> None:
        if committed(ctx, self.name):
            return
        domains = [c.domain for c in ctx.data.clients]
        answer = self.ask_bases(ctx) if self.settings.assignment == "subspace" else None
        angles = None if answer is None else answer.value["angles"].numpy()
        t0 = time.perf_counter()
        labels = self.assign(angles, domains)
        t_cluster = time.perf_counter() - t0
        cost = (
            ClusterCost(0, 0, 0.0, t_cluster)
            if answer is None
            else ClusterCost(answer.bytes_up, answer.value["scalars"], answer.seconds, t_cluster)
        )
        scan = (
            None
            if angles is None
            else threshold_scan(angles, domains, default_scan(angles, self.settings.threshold), self.settings.linkage)
        )
        self.commit(ctx, Clusters(labels, domains, purity(labels, domains), angles, scan), cost)

    def ask_bases(self, ctx: RunContext) -> QueryAnswer:
        """U_m from every client, reduced on the server to the angle matrix and the uploads' float scalars."""
        m = len(ctx.data.clients)

        def reduce(outcome: QueryOutcome) -> dict[str, Any]:
            bases = [outcome.uploads()[k]["basis"] for k in range(m)]
            return {"angles": torch.tensor(angle_matrix(bases, self.settings.angle)), "scalars": scalars(bases)}

        return ctx.query_once(self.name, "bases", SubspaceBasis.of(self.settings), reduce)

    def assign(self, angles: np.ndarray | None, domains: list[str]) -> list[int]:
        """Cluster labels: the linkage at the threshold, the true domains (`assignment: domains`) or one cluster."""
        if angles is not None:
            return cluster(angles, self.settings.threshold, self.settings.linkage)
        if self.settings.assignment == "domains":
            order: dict[str, int] = {}
            return [order.setdefault(d, len(order)) for d in domains]
        return [0] * len(domains)

    def commit(self, ctx: RunContext, clusters: Clusters, cost: ClusterCost) -> None:
        """Publish the clusters, write fkpl_angles.png and fkpl_clusters.json, commit the record and checkpoint."""
        if clusters.angles is not None:
            plot_angles(clusters.angles, clusters.domains, clusters.labels, ctx.artifact("fkpl_angles.png"))
        published = clusters.published()
        ctx.publish(self.name, published)
        text = json.dumps(
            {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in published.items()}, indent=1
        )
        ctx.artifact("fkpl_clusters.json").write_text(text + "\n")
        found = {
            records.FKPL_NUM_CLUSTERS: clusters.count,
            records.FKPL_PURITY: clusters.purity,
            records.FKPL_THRESHOLD: self.settings.threshold,
            records.FKPL_LABELS: clusters.labels,
        }
        record = records.record(0, found, cost.record(), phase=self.name)
        ctx.commit(record, records.record(0, cost.timing(), phase=self.name), checkpoint=True)
