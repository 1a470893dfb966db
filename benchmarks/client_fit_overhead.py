"""Framework overhead of one client's local fit, for the "frozen encoder + small head" family.

Compares, in the same process and alternated (these machines are shared and noisy, so only ratios matter):
  plain      a bare PyTorch loop over the same pre-sliced batches (the reference),
  flsuite    `run_client` (one lean Trainer.fit, manual optimisation, one training_step per epoch),
  naive      a default-style Lightning fit: DataLoader over a TensorDataset, automatic optimisation
             (logger/checkpointing/progress bar off as they would be inside any client).

    python benchmarks/client_fit_overhead.py [--samples 2000] [--epochs 2] [--dim 1280] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from flsuite.data.base import ClientData, EpochBatches, FederatedData, Split
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.local.trainer import _quiet_lightning, make_trainer
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import Linear
from flsuite.seeding import torch_generator


class NaiveModule(L.LightningModule):
    def __init__(self, model, local):
        super().__init__()
        self.model, self.local = model, local

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return self.local.make_optimizer(self.model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _quiet_lightning()

    g = torch.Generator().manual_seed(0)
    split = Split(
        torch.randn(args.samples, args.dim, generator=g), torch.randint(0, args.classes, (args.samples,), generator=g)
    )
    data = FederatedData([ClientData(0, "d", split)], {"d": split}, num_classes=args.classes)
    local = LocalTraining(epochs=args.epochs, batch_size=args.batch_size, lr=0.01)
    env = ClientEnvironment(data, Linear(), FedAvg(), local, seed=0)
    weights = env.build_model().state_dict()
    steps = args.epochs * -(-args.samples // args.batch_size)

    def plain() -> None:
        model = env.build_model()
        model.load_state_dict(weights)
        opt = local.make_optimizer(model.parameters())
        batches = EpochBatches(split, args.batch_size, torch_generator(1), epochs=args.epochs)
        for _ in range(args.epochs):
            for x, y in batches.epoch():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()

    def flsuite() -> None:
        run_client(env, ClientTask(1, 0, 1, weights))

    def naive() -> None:
        model = env.build_model()
        model.load_state_dict(weights)
        loader = DataLoader(TensorDataset(split.x, split.y), batch_size=args.batch_size, shuffle=True)
        make_trainer(local, args.epochs).fit(NaiveModule(model, local), loader)

    runners = {"plain": plain, "flsuite": flsuite, "naive": naive}
    for fn in runners.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.reps):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    ref = statistics.median(times["plain"])
    print(
        f"Linear({args.dim}, {args.classes}), batch {args.batch_size}, {steps} steps per fit, "
        f"median of {args.reps}, 1 thread"
    )
    print(f"{'runner':<10}{'fit (ms)':>10}{'per step (ms)':>15}{'× plain':>9}")
    for name in runners:
        t = statistics.median(times[name])
        print(f"{name:<10}{1000 * t:>10.1f}{1000 * t / steps:>15.3f}{t / ref:>9.2f}")


if __name__ == "__main__":
    main()
