"""Which methods `local.loop: compiled` captures, and how close it stays to the lean loop.

Every client-side method runs 3 rounds of the test federation (Gaussian features, 4 clients, an MLP head, or the
probabilistic encoders FedSR/FedCiR need) with `local.loop: lean`, twice with `local.loop: compiled`, in one
process. Reported per method: whether the compiled runs finish, the largest difference of a final global weight from
the lean run, and whether the two compiled runs agree to the bit; for a method dynamo cannot capture, the error the
run stops with (abridged).

    python benchmarks/compiled_loop_methods.py [METHOD ...]     # ~3 min on 2 cores for all; prints a Markdown table
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import torch

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.local import compiled
from flsuite.federation.task import LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedcir import FedCiR
from flsuite.methods.feddc import FedDC
from flsuite.methods.feddyn import FedDyn
from flsuite.methods.fedgen import FedGen
from flsuite.methods.fednova import FedNova
from flsuite.methods.fedntd import FedNTD
from flsuite.methods.fedproc import FedProc
from flsuite.methods.fedproto import FedProto
from flsuite.methods.fedprox import FedProx
from flsuite.methods.fedsr import FedSR, FedSRModel
from flsuite.methods.fpl import FPL
from flsuite.methods.moon import MOON
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP
from flsuite.models.probabilistic import ProbabilisticEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test suite's small federation, as the tests run it
from tests.helpers import head_federation  # noqa: E402

MLP6 = MLP(hidden=(6,))
CASES = {  # name: (method factory, model)
    "FedAvg": (FedAvg, MLP6),
    "FedProx": (FedProx, MLP6),
    "SCAFFOLD": (Scaffold, MLP6),
    "FedDyn": (FedDyn, MLP6),
    "FedDC": (FedDC, MLP6),
    "FedNova": (FedNova, MLP6),
    "MOON": (MOON, MLP6),
    "FedNTD": (FedNTD, MLP6),
    "FedProto": (FedProto, MLP6),
    "FedProc": (FedProc, MLP6),
    "FPL": (FPL, MLP6),
    "FedGen": (FedGen, MLP6),
    "FedSR": (FedSR, FedSRModel(hidden=[16], dim=8)),
    "FedCiR": (lambda: FedCiR(lam_reg=0.5, lam_align=1e-3), ProbabilisticEncoder(hidden=[16], dim=8)),
}


def run(root: Path, name: str, loop: str):
    factory, model = CASES[name]
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, loop="compiled" if loop.startswith("compiled") else loop)
    try:
        head_federation(root / f"{name}-{loop}", rounds=3, model=model, method=factory(), local=local).fit()
    except Exception as e:  # noqa: BLE001 — report the reason, go on with the next method
        reason = re.search(
            r"compiled could not compile (\S+) into one graph \((.*)\)\. Use local.loop", str(e), re.DOTALL
        )
        when = str(e).split(":")[0]  # "round k"
        return f"{when}: {reason.group(2)}" if reason else f"{type(e).__name__}: {e}"
    return load_checkpoint(root / f"{name}-{loop}").global_weights


def scanned_calls() -> list[int]:
    """Counts the scanned calls of every CompiledSteps from here on that ran (not those that could not compile)."""
    calls, scan = [], compiled.CompiledSteps._scan

    def counted(self, batches):
        losses = scan(self, batches)
        if losses is not None:
            calls.append(1)
        return losses

    compiled.CompiledSteps._scan = counted
    return calls


def main() -> None:
    root = Path(tempfile.mkdtemp())
    calls = scanned_calls()
    print(
        "| method | compiled | steps per compiled call | max abs difference from lean | compiled rerun identical |\n"
        "|---|---|---|---|---|"
    )
    for name in sys.argv[1:] or CASES:
        lean = run(root, name, "lean")
        calls.clear()
        first, second = (run(root, name, loop) for loop in ("compiled", "compiled again"))
        stepping = "a run of full batches (scan)" if calls else "one"
        if isinstance(lean, str):
            print(f"| {name} | (lean run failed: {lean[:200]}) | | | |")
        elif isinstance(first, str):
            print(f"| {name} | no, {first[:260]} | | | |")
        else:
            diff = max((first[k] - lean[k]).abs().max().item() for k in lean)
            same = not isinstance(second, str) and all(torch.equal(first[k], second[k]) for k in first)
            print(f"| {name} | yes | {stepping} | {diff:.1e} | {'yes' if same else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
