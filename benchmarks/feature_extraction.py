"""Throughput of ``extract_features`` versus a bare batched forward of the same encoder.

Runs EfficientNet-Lite0 over random uint8 28x28 grey images (resized to 224)
both via ``extract_features`` (no cache) and via a bare loop
``encoder.encode(encoder.preprocess(batch))`` in the same process.  The two
are interleaved chunk by chunk (alternating which goes first) so that load
changes on a shared machine hit both alike; prints images/s and the ratio.

    HF_HUB_OFFLINE=1 python benchmarks/feature_extraction.py --num-images 2000 [--batch-size 64]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch

from flsuite.data.feature_cache import extract_features
from flsuite.models.encoders import EfficientNetLite0
from flsuite.models.frozen_encoder import FrozenEncoder
from flsuite.runtime import keep_freed_memory


def bare_loop(encoder: FrozenEncoder, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Reference: ``encoder.encode(encoder.preprocess(batch))`` per batch, no bookkeeping."""
    outs = []
    with torch.inference_mode():
        for start in range(0, images.shape[0], batch_size):
            batch = images[start : start + batch_size].to(encoder.device)
            outs.append(encoder.encode(encoder.preprocess(batch)).cpu())
    return torch.cat(outs)


def timed(fn: Callable[[], object], sync: bool) -> float:
    """Wall-clock seconds of ``fn()`` (CUDA-synchronised when ``sync``)."""
    if sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if sync:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=512, help="images per interleaved timing chunk")
    parser.add_argument("--rounds", type=int, default=1, help="passes over all images per method")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    keep_freed_memory()  # as the flsuite command does

    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.num_images, 1, 28, 28), dtype=torch.uint8)
    encoder = EfficientNetLite0(image_size=args.image_size, device=args.device)
    sync = encoder.device.type == "cuda"
    print(
        f"device={encoder.device} threads={torch.get_num_threads()} images={args.num_images} "
        f"batch_size={args.batch_size} chunk={args.chunk} rounds={args.rounds} image_size={args.image_size}"
    )

    warm = images[: min(args.batch_size, args.num_images)]
    bare_loop(encoder, warm, args.batch_size)
    extract_features(encoder, warm, batch_size=args.batch_size)

    methods: dict[str, Callable[[torch.Tensor], object]] = {
        "extract_features": lambda chunk: extract_features(encoder, chunk, batch_size=args.batch_size),
        "bare_loop": lambda chunk: bare_loop(encoder, chunk, args.batch_size),
    }
    seconds = dict.fromkeys(methods, 0.0)
    step = done = 0
    for _ in range(args.rounds):
        for start in range(0, args.num_images, args.chunk):
            chunk = images[start : start + args.chunk]
            names = list(methods) if step % 2 == 0 else list(reversed(methods))
            for name in names:
                seconds[name] += timed(partial(methods[name], chunk), sync)
            step += 1
            done += chunk.shape[0]
            print(f"{done:6d} images: " + ", ".join(f"{n} {done / s:.1f} img/s" for n, s in seconds.items()))

    total = args.num_images * args.rounds
    rate = {name: total / s for name, s in seconds.items()}
    print(f"extract_features: {rate['extract_features']:.1f} images/s ({seconds['extract_features']:.1f} s)")
    print(f"bare loop:        {rate['bare_loop']:.1f} images/s ({seconds['bare_loop']:.1f} s)")
    print(f"ratio extract_features / bare = {rate['extract_features'] / rate['bare_loop']:.3f}")


if __name__ == "__main__":
    main()
