"""FKPL's Stage-II exchanges (spec §1.5–1.7): the local prototypes p_m^k a client uploads and the domain prototypes
P_v^k the server forms from them (`PrototypeQuery`, `domain_prototypes`), then the virtual features z̃ a client mixes
from its F(x) and those prototypes (Eq. 10, `VirtualFeatureQuery`) and the pool the server fits its head on
(`pool_features`). Each reduction's typed view (`DomainPrototypes`, `VirtualFeatures`) reads the checkpointed answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flsuite.federation.query import ClientQuery, QueryOutcome, QueryTask
from flsuite.methods.fkpl.costs import scalars
from flsuite.methods.fkpl.model import encode
from flsuite.methods.fkpl.settings import CalibrationSettings, LamOn, Partner


class PrototypeQuery(ClientQuery):
    """p_m^k = mean of F(x) over the client's class-k samples, for every class it holds (uploaded with the class
    ids)."""

    name = "fkpl/prototypes"

    def compute(self, client, task: QueryTask, model) -> dict[str, Any]:
        z = encode(model, client.train.x).to(torch.float64)
        classes = torch.unique(client.train.y)
        return {"protos": torch.stack([z[client.train.y == k].mean(0) for k in classes]).float(), "classes": classes}


class VirtualFeatureQuery(ClientQuery):
    """Eq. (10): z̃ = w·F(x) + (1 − w)·P_v^y with w = λ (`lam_on: feature`) or 1 − λ (`lam_on: prototype`, the official
    code's (1 − λ)·f + λ·proto), λ ~ U(a, b) (rounded to `lam_decimals` when set, as the official
    `np.round(l + r_reg * np.random.random(), 2)`), all from the client's derived stream; uploads (z̃, y) only.

    Partners of a sample (x, y): `one` draws v uniformly among the clusters holding y (`other`: among the other
    clusters when one holds y), one z̃ per sample; `all` pairs it with every v ∈ V_y, one z̃ and a fresh λ per pair
    (the official `mixup_features_with_domain_protos`: `for domain_proto in protos: lam = ...`), so
    N_g = Σ_i |V_{y_i}|. `per_sample` passes R of fresh draws multiply N_g by R."""

    name = "fkpl/virtual"

    def __init__(
        self, a: float, b: float, lam_on: LamOn, partner: Partner, per_sample: int, lam_decimals: int | None = None
    ) -> None:
        self.a, self.b, self.lam_on, self.partner, self.per_sample, self.lam_decimals = (
            a,
            b,
            lam_on,
            partner,
            per_sample,
            lam_decimals,
        )

    @classmethod
    def of(cls, settings: CalibrationSettings) -> VirtualFeatureQuery:
        return cls(
            settings.a,
            settings.b,
            settings.lam_on,
            settings.partner,
            settings.virtual_per_sample,
            settings.lam_decimals,
        )

    def lam(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """n draws of λ ~ U(a, b), [n, 1]."""
        lam = self.a + (self.b - self.a) * torch.rand(n, 1, generator=gen)
        return lam if self.lam_decimals is None else torch.round(lam, decimals=self.lam_decimals)

    def partners(self, has: torch.Tensor, y: torch.Tensor, own: int) -> torch.Tensor:
        """[n, V]: the clusters each sample may take its prototype from (`other`: not its own while another holds y)."""
        allowed = has[:, y].T.clone()
        if self.partner == "other":
            others = allowed.clone()
            others[:, own] = False
            allowed = torch.where(others.any(dim=1, keepdim=True), others, allowed)
        return allowed

    def compute(self, client, task: QueryTask, model) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(task.seed)
        z, y = encode(model, client.train.x), client.train.y
        protos = unpack_prototypes(task.broadcast)
        allowed = self.partners(task.broadcast["has"], y, int(task.broadcast["cluster"][client.client_id]))
        feats, labels = [], []
        for _ in range(self.per_sample):
            if self.partner == "all":
                i, v = allowed.nonzero(as_tuple=True)  # every (sample, cluster holding its class), sample-major
                lam = self.lam(len(i), gen)
            else:
                i = torch.arange(len(y))
                lam = self.lam(len(y), gen)
                v = torch.multinomial(allowed.float(), 1, generator=gen).squeeze(1)
            w = lam if self.lam_on == "feature" else 1.0 - lam
            feats.append(w * z[i] + (1.0 - w) * protos[v, y[i]])
            labels.append(y[i])
        return {"features": torch.cat(feats), "labels": torch.cat(labels)}


def unpack_prototypes(broadcast: dict[str, Any]) -> torch.Tensor:
    """P [V, K, d_V] from the broadcast: only the available prototypes travel ("protos" [Σ_k |V_k|, d_V], in the
    row-major order of the mask "has" [V, K]), as Table 9's M·d_V·Σ_k |V_k|; absent ones are zero (never drawn)."""
    has, packed = broadcast["has"], broadcast["protos"]
    full = packed.new_zeros(*has.shape, packed.shape[-1])
    full[has] = packed
    return full


def domain_prototypes(outcome: QueryOutcome, labels: list[int], num_classes: int) -> dict[str, torch.Tensor]:
    """P_v^k = unweighted mean of p_m^k over the members m of cluster v that hold class k (spec §1.6); `has` [V, K]."""
    uploads = outcome.uploads()
    dim = next(iter(uploads.values()))["protos"].shape[1]
    num = max(labels) + 1
    sums = torch.zeros(num, num_classes, dim, dtype=torch.float64)
    counts = torch.zeros(num, num_classes, dtype=torch.float64)
    for k, u in uploads.items():
        sums[labels[k], u["classes"]] += u["protos"].to(torch.float64)
        counts[labels[k], u["classes"]] += 1
    return {
        "protos": (sums / counts.clamp(min=1)[..., None]).float(),
        "has": counts > 0,
        "scalars_up": torch.tensor(scalars([u["protos"] for u in uploads.values()])),
    }


@dataclass(frozen=True)
class DomainPrototypes:
    """`domain_prototypes`' answer: P [V, K, d_V], the mask `has` [V, K] of the available P_v^k, and the float scalars
    the clients uploaded for them."""

    protos: torch.Tensor
    has: torch.Tensor
    scalars_up: int

    @classmethod
    def read(cls, value: dict[str, torch.Tensor]) -> DomainPrototypes:
        return cls(value["protos"], value["has"], int(value["scalars_up"]))

    def broadcast(self, labels: list[int]) -> dict[str, torch.Tensor]:
        """What the virtual-feature query sends every client: the available prototypes, their mask, the clusters."""
        return {"protos": self.protos[self.has], "has": self.has, "cluster": torch.tensor(labels)}


def pool_features(outcome: QueryOutcome, labels: list[int]) -> dict[str, torch.Tensor]:
    """The clients' virtual features in client order, with each one's cluster (known to the server: the sender)."""
    ups = outcome.uploads()
    return {
        "x": torch.cat([ups[k]["features"] for k in sorted(ups)]),
        "y": torch.cat([ups[k]["labels"] for k in sorted(ups)]),
        "cluster": torch.cat([torch.full((len(ups[k]["labels"]),), labels[k]) for k in sorted(ups)]),
    }


@dataclass(frozen=True)
class VirtualFeatures:
    """`pool_features`' answer: z̃ [N_g, d_V], their labels and their senders' clusters."""

    x: torch.Tensor
    y: torch.Tensor
    cluster: torch.Tensor

    @classmethod
    def read(cls, value: dict[str, torch.Tensor]) -> VirtualFeatures:
        return cls(value["x"], value["y"], value["cluster"])
