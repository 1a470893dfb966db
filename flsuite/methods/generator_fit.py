"""The generator's server-side Lightning fit (FedCiR, FedGen): E_g Adam steps on the ensemble of the round's client
heads (the loss: `flsuite.methods.generator_model`). A module of its own, imported by the rounds that train a
generator, so that runs of other methods never import Lightning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch

from flsuite.methods.generator_model import ConditionalGenerator, Ensemble, diversity_loss, ensemble_loss


class GeneratorFit(L.LightningModule):
    """E_g Adam steps of the generator on the ensemble of the round's client heads (one `training_step` over the
    pre-drawn (ε, y) batches, manual optimisation like the clients' lean loop)."""

    def __init__(
        self,
        generator: ConditionalGenerator,
        heads: Sequence[tuple[torch.Tensor, torch.Tensor]],
        coef: torch.Tensor,
        mode: Ensemble,
        diversity: float,
        lr: float,
        optimizer_state: dict | None,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator, self.mode, self.diversity, self.lr, self.weight_decay = (
            generator,
            mode,
            diversity,
            lr,
            weight_decay,
        )
        self._heads, self._coef, self._opt_state = list(heads), coef, optimizer_state
        self.losses: list[float] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = torch.optim.Adam(self.generator.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self._opt_state:
            opt.load_state_dict(self._opt_state)  # the moments; the round's rate and decay are set again below
            for group in opt.param_groups:
                group.update(lr=self.lr, weight_decay=self.weight_decay)
        self.optimizer = opt
        return opt

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch

    def on_fit_start(self) -> None:
        self._heads = [(w.to(self.device), b.to(self.device)) for w, b in self._heads]
        self._coef = self._coef.to(self.device)

    def training_step(self, epoch_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        opt = self.trainer.optimizers[
            0
        ]  # the torch optimiser of `configure_optimizers` (Lightning's wrapper holds the same)
        for eps, y in epoch_batches:
            eps, y = eps.to(self.device), y.to(self.device)
            opt.zero_grad(set_to_none=True)
            z = self.generator(y, eps)
            loss = ensemble_loss(z, y, self._heads, self._coef, self.mode)
            if self.diversity:
                loss = loss + self.diversity * diversity_loss(eps, z)
            loss.backward()
            opt.step()
            self.losses.append(float(loss.detach()))
