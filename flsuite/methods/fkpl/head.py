"""FKPL's Stage-II heads (spec §1.8–1.9, §7.11): the server's linear head over F trained on the virtual features
(`fit_head`), one head per cluster (`personal_heads`, Fig. 6), and the federated-head control (`FederatedHead`,
Table 5)."""

from __future__ import annotations

from collections.abc import Sequence

from flsuite import records
from flsuite.data.base import EpochBatches, FederatedData, Split
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, LocalTraining, State, Weights
from flsuite.federation.weights import clone_weights, weighted_average
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl.model import ConcatModel
from flsuite.methods.fkpl.prototypes import VirtualFeatures
from flsuite.methods.fkpl.settings import CalibrationSettings
from flsuite.metrics import evaluate
from flsuite.models.heads import Linear
from flsuite.seeding import seed_torch


def fit_head(
    server: ServerContext, split: Split, num_classes: int, settings: CalibrationSettings, purpose: str
) -> tuple[Weights, float]:
    """A linear head (with bias) trained with CE on `split` for `head_epochs` epochs as a server-side Lightning fit."""
    local = LocalTraining(
        epochs=settings.head_epochs,
        batch_size=settings.head_batch_size,
        lr=settings.head_lr,
        momentum=settings.head_momentum,
        weight_decay=0.0,
        accelerator=server.accelerator,
    )
    seed_torch(server.seed_for(f"{purpose}/init"))
    model = Linear().build(tuple(split.x.shape[1:]), num_classes)
    fit = server.train(
        model,
        EpochBatches(  # streamed: each batch gathered when read, not an epoch of 83,000 x 3840 (1.3 GB) at once
            split, local.batch_size, server.generator(f"{purpose}/batches"), epochs=local.epochs, reuse=True
        ),
        local,
        purpose,
    )
    w = clone_weights(model.state_dict())
    return {"weight": w["1.weight"], "bias": w["1.bias"]}, fit.mean_loss


def personal_heads(
    server: ServerContext,
    model: ConcatModel,
    data: FederatedData,
    features: VirtualFeatures,
    labels: list[int],
    settings: CalibrationSettings,
) -> dict[str, float]:
    """Per-cluster heads on that cluster's virtual features (Fig. 6): pcluster<v>/acc/<domain>, and personal/acc/<d>
    with each domain served by the head of the cluster holding most of its clients. `model`'s head is left as the last
    cluster's."""
    out: dict[str, float] = {}
    for v in range(max(labels) + 1):
        mask = features.cluster == v
        head, _ = fit_head(
            server, Split(features.x[mask], features.y[mask]), data.num_classes, settings, purpose=f"fkpl/head{v}"
        )
        model.head.load_state_dict(head)  # type: ignore[union-attr]
        out.update(
            {
                f"{records.fkpl_cluster_head_prefix(v)}{k}": val
                for k, val in evaluate(model, data.test, data.num_classes).items()
            }
        )
    domains = [c.domain for c in data.clients]
    personal = f"{records.FKPL_PERSONAL_PREFIX}{records.ACC_PREFIX}"
    for d in data.test:
        votes = [labels[k] for k, dom in enumerate(domains) if dom == d]
        v = max(set(votes), key=votes.count) if votes else 0
        out[f"{personal}{d}"] = out[f"{records.fkpl_cluster_head_prefix(v)}{records.ACC_PREFIX}{d}"]
    vals = [out[f"{personal}{d}"] for d in data.test]
    out[f"{records.FKPL_PERSONAL_PREFIX}{records.ACC_MEAN}"] = sum(vals) / len(vals)
    return out


class FederatedHead(FedAvg):
    """The Table-5 control: FedAvg of the trainable parameters only (the head over frozen F); F is never averaged and
    only the head travels each round."""

    def aggregate(
        self,
        round: int,
        global_weights: Weights,
        results: Sequence[ClientResult],
        server_state: State,
        ctx: ServerContext | None = None,
    ) -> tuple[Weights, State]:
        trained = weighted_average(
            [self.travelling(r.weights, "trainable") for r in results], self.aggregation_coefficients(results)
        )
        return {**global_weights, **trained}, server_state

    weights_up = weights_down = "trainable"
