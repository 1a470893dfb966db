"""A run's `environment.json`: what reproduces it besides its config (seeds, versions, code, command line, threads),
and how a resume is appended to it; with the run folder's JSON reading and atomic writing."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flsuite.provenance import code_version
from flsuite.seeding import Seeds


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file's content; None when it is missing, unreadable or not an object."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float))
    os.replace(tmp, path)


def environment_info(seed: int, seeds: Seeds | None = None) -> dict[str, Any]:
    """What is needed to reproduce a run besides its config; `seed` and the data and training seeds it ran with
    (`seeds`, default both `seed`: `flsuite.seeding.Seeds`); `code`: the package version, git commit and uncommitted
    changes (`flsuite.provenance.code_version`), which decide whether a study driver may reuse the run;
    `cpu_capability`: the vector instructions torch's CPU kernels use (AVX2, AVX512, …), which, like the thread count,
    decide the last bits of a CPU run's sums (the same config gives other metrics on another kind of CPU)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    import torch

    try:  # from its metadata: a process that never builds a Trainer (a run built in Python, lean loop) never imports it
        lightning_version = installed_version("lightning")
    except PackageNotFoundError:
        lightning_version = "not installed"
    versions = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "lightning": lightning_version,
        "numpy": np.__version__,
    }
    try:
        from importlib.metadata import version

        versions["flsuite"] = version("flsuite")
    except Exception:  # running from a source tree that is not installed
        versions["flsuite"] = "source"
    from flsuite.runtime import thread_counts

    seeds = seeds or Seeds(seed, seed)
    return {
        "seed": seed,
        **seeds.as_record(),
        "versions": versions,
        "code": code_version(),
        "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "argv": sys.argv,
        "threads": thread_counts(),
    }


def resumed_environment(
    previous: Mapping[str, Any] | None, now: Mapping[str, Any], resumed_at: Mapping[str, int]
) -> dict[str, Any]:
    """environment.json after `flsuite fit --resume` (decision, issue 38): the record of the run's start is kept as it
    was (its `code`, `versions`, `argv`, seeds, `local_loop`: the code that began the run) and the resume is appended to
    `resumes` — its code, versions, CPU capability, command line, threads, the loop it trains with (`local_loop`) and
    where it continued (`resumed_at`: phase, round). A run resumed under other code is so recorded, not refused (a
    killed run can be salvaged), and `flsuite.provenance` treats it as made by more than one code version. A folder
    without a readable record (from before environment.json) starts from `now`."""
    base = dict(previous) if previous else {k: v for k, v in now.items() if k != "code"}
    kept = ("code", "versions", "cpu_capability", "argv", "threads", "local_loop")
    entry = {k: now[k] for k in kept if k in now} | dict(resumed_at)
    return base | {"resumes": [*base.get("resumes", []), entry]}


def record_environment(
    run_dir: Path, environment: Mapping[str, Any], resumed_at: Mapping[str, int] | None = None
) -> None:
    """Write `run_dir/environment.json`: `environment` for a new run; for a resume (`resumed_at`: phase, round) the
    start's record kept and the resume appended (`resumed_environment`)."""
    path = run_dir / "environment.json"
    write_json(
        path, environment if resumed_at is None else resumed_environment(read_json(path), environment, resumed_at)
    )
