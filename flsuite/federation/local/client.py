"""Running one client's local training over the method's `ClientModule`: the lean and compiled loops on the CPU by
`run_fit` (no Trainer), else one `Trainer.fit` of a `LocalFit`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flsuite.data.base import FederatedData
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.batches import client_batches
from flsuite.federation.local.choice import outside_a_run
from flsuite.federation.local.loops import ClientFit, run_fit, runs_without_a_trainer
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.federation.transport import Transport
from flsuite.federation.weights import is_finite
from flsuite.models.heads import ModelSpec
from flsuite.runtime import step_flops
from flsuite.seeding import seed_torch


@dataclass
class ClientEnvironment:
    """What stays the same for every client task of a run (an executor ships it to workers once)."""

    data: FederatedData
    model: ModelSpec
    method: HyperParameters
    local: LocalTraining
    seed: int

    def build_model(self) -> nn.Module:
        return self.model.build(self.data.input_shape, self.data.num_classes)

    def step_flops(self) -> float:
        """Forward FLOPs of one local batch, what the thread policy decides by (`flsuite.runtime.step_flops`); the
        model is built aside, leaving the random state untouched."""
        with torch.random.fork_rng(devices=[]):
            model = self.build_model()
        return step_flops(model, self.data.input_shape, self.local.batch_size)


def run_client(env: ClientEnvironment, task: ClientTask) -> ClientResult:
    """Train client `task.client_id` from the global weights and return its result.

    Randomness (model-internal, e.g. dropout, the batch order and augmentation) comes from streams derived from the
    task's seed, so the result does not depend on which worker runs it or in which order.
    """
    split, local = env.data.clients[task.client_id].train, outside_a_run(env.local)
    seed_torch(task.seed)
    model = env.build_model()
    load_task_weights(model, task, env.method.transport)
    client = env.method.client_module(model=model, method=env.method.settings, local=local, task=task)
    batches, epochs = client_batches(split, local, task.seed)
    if runs_without_a_trainer(local.loop, local.accelerator, local.precision):
        statistics = run_fit(ClientFit(client), batches, epochs)
    else:
        from flsuite.federation.local.trainer import LocalFit, fit_in_a_trainer

        fit = LocalFit(client)
        fit_in_a_trainer(fit, batches, local, epochs)
        statistics = fit.statistics
    return client_result(client, statistics, env.method.transport, num_samples=len(split))


def load_task_weights(model: nn.Module, task: ClientTask, transport: Transport) -> None:
    """Load what the task carries and what the client holds into `model`; the entries kept on the client
    (`transport.kept`) keep the model's own values. Any other entry missing or unknown: an error."""
    weights = {**task.held, **task.global_weights} if task.held else task.global_weights
    missing, unexpected = model.load_state_dict(weights, strict=False)
    absent = sorted(set(missing) - transport.kept)
    if absent or unexpected:
        raise RuntimeError(
            f"client {task.client_id}'s task does not fit its model: missing {absent}, unexpected {sorted(unexpected)}"
        )


def client_result(client: ClientModule, fit: FitStatistics, transport: Transport, num_samples: int) -> ClientResult:
    """The fit's outcome for the server, built by the engine (not a hook): the weights the method declares travelling
    up (`transport.upward`, CPU copies; nothing else of the model leaves the client), its upload, the client's next
    state, the loop's statistics `fit` and the method's metrics, and whether the whole trained model is finite."""
    weights = client.model.state_dict()
    return ClientResult(
        client_id=client.task.client_id,
        num_samples=num_samples,
        weights={k: v.detach().to("cpu", copy=True) for k, v in transport.upward(weights).items()},
        upload=client.upload(fit),
        state=client.next_state(fit),
        train_loss=fit.mean_loss,
        num_steps=fit.num_steps,
        task_loss=fit.mean_task_loss,
        metrics=client.metrics(fit),
        finite=is_finite(weights),
    )
