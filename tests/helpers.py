"""Small federations for tests: fast, offline, W&B off, no progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flsuite.data.builtin import GaussianFeatures, UCIDigitsDomains
from flsuite.federation.loop import Federation
from flsuite.federation.task import LocalTraining
from flsuite.methods.base import ClientModule
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import Linear, SmallCNN
from flsuite.tracking import WandbConfig


def head_federation(run_dir: Path, **overrides: Any) -> Federation:
    """A linear head over Gaussian features: 2 domains × 2 clients."""
    kwargs: dict[str, Any] = dict(
        data=GaussianFeatures(dim=8, num_classes=3, num_domains=2, clients_per_domain=2, samples_per_client=60, test_per_domain=60),
        model=Linear(),
        rounds=3,
        seed=7,
        local=LocalTraining(epochs=2, batch_size=16, lr=0.05),
        run_dir=run_dir,
        progress=False,
        wandb=WandbConfig(enabled=False),
    )
    kwargs.update(overrides)
    return Federation(**kwargs)


def cnn_federation(run_dir: Path, **overrides: Any) -> Federation:
    """A small CNN over the quickstart digits: 4 domains × 1 client, few samples."""
    kwargs: dict[str, Any] = dict(
        data=UCIDigitsDomains(domains=("clean", "inverted"), clients_per_domain=2, beta=0.5),
        model=SmallCNN(channels=(4, 8), hidden=16),
        rounds=3,
        seed=3,
        local=LocalTraining(epochs=1, batch_size=32, lr=0.05),
        run_dir=run_dir,
        progress=False,
        wandb=WandbConfig(enabled=False),
    )
    kwargs.update(overrides)
    return Federation(**kwargs)


class Exploding(ClientModule):
    """Client 0 returns NaN weights in round 2 (a diverged client)."""

    def result(self, num_samples):
        if self.task.client_id == 0 and self.task.round == 2:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return super().result(num_samples)


class ExplodingFedAvg(FedAvg):
    """FedAvg whose client 0 diverges in round 2."""

    client_module = Exploding
