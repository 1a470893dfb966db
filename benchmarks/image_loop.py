"""The `standard` local loop on an image model against a bare PyTorch loop on the same batches, side by side.

    python benchmarks/image_loop.py --samples 512 --epochs 2 --repeats 3

ResNet-10 (FKPL's small-input stem) on 32×32×3 inputs, 10 classes, batch 32, SGD (momentum 0.9, weight decay 5e-4), all
the process's torch threads. Each repetition runs, alternated, one client fit through flsuite (`run_client`,
`local.loop: standard`: one Lightning `Trainer.fit`, automatic optimisation) and the bare loop (`zero_grad → forward →
loss → backward → step` over the same batches in the same order), in fp32 and, where the CPU has bf16 support, with
`bf16-mixed` (flsuite) against `torch.autocast("cpu", torch.bfloat16)` (bare); the bare loop also in channels_last
memory format. Reported: seconds per fit (median of the repetitions) and the ratios to the bare loop and to the fastest
bare variant.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from flsuite.data.base import ClientData, EpochBatches, FederatedData, Split
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import HyperParameters
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.backbones import ResNet10
from flsuite.seeding import torch_generator


def bf16_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    split = Split(
        torch.randn(args.samples, 3, 32, 32, generator=gen), torch.randint(0, 10, (args.samples,), generator=gen)
    )
    data = FederatedData([ClientData(0, "d", split)], {"d": split}, num_classes=10)
    spec, seed = ResNet10(), 123
    torch.manual_seed(0)
    weights = {k: v.clone() for k, v in spec.build((3, 32, 32), 10).state_dict().items()}

    def local(precision: str) -> LocalTraining:
        return LocalTraining(
            epochs=args.epochs,
            batch_size=32,
            lr=0.01,
            momentum=0.9,
            weight_decay=5e-4,
            loop="standard",
            precision=precision,
        )

    def flsuite_fit(precision: str) -> float:
        env = ClientEnvironment(data, spec, HyperParameters(FedAvg()), local(precision), seed)
        t0 = time.perf_counter()
        run_client(env, ClientTask(1, 0, seed, weights))
        return time.perf_counter() - t0

    def bare_fit(precision: str, channels_last: bool) -> float:
        torch.manual_seed(seed)
        model = spec.build((3, 32, 32), 10)
        model.load_state_dict(weights)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        model = model.to(memory_format=fmt)
        opt = local(precision).make_optimizer(model.parameters())
        batches = EpochBatches(split, 32, torch_generator(seed, purpose="batches"), epochs=args.epochs)
        model.train()
        t0 = time.perf_counter()
        for _ in range(batches.epochs):  # iterating EpochBatches gives one epoch (Lightning asks once per epoch)
            for x, y in batches.epoch():
                x = x.contiguous(memory_format=fmt)
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        return time.perf_counter() - t0

    cases = {
        "flsuite standard fp32": lambda: flsuite_fit("32-true"),
        "bare fp32": lambda: bare_fit("32-true", False),
        "bare fp32 channels_last": lambda: bare_fit("32-true", True),
    }
    if bf16_supported():
        cases.update(
            {
                "flsuite standard bf16-mixed": lambda: flsuite_fit("bf16-mixed"),
                "bare bf16 autocast": lambda: bare_fit("bf16-mixed", False),
                "bare bf16 autocast channels_last": lambda: bare_fit("bf16-mixed", True),
            }
        )
    times: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else reversed(order):  # alternated: A B C … C B A
            times[name].append(cases[name]())
    median = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.samples} samples × {args.epochs} epochs, "
        f"bf16 support: {bf16_supported()}"
    )
    print("| loop | s per fit (median) | / bare, same precision | / fastest bare, same precision |\n|---|---|---|---|")
    for name, t in median.items():
        same = [v for k, v in median.items() if k.startswith("bare") and ("bf16" in k) == ("bf16" in name)]
        bare = median["bare bf16 autocast" if "bf16" in name else "bare fp32"]
        print(f"| {name} | {t:.2f} | {t / bare:.2f} | {t / min(same):.2f} |")


if __name__ == "__main__":
    main()
