"""Checks a run makes before any work (before its data is built, its run folder created or a W&B run started), so
that a setting this machine cannot honour stops at once with one error naming the key, the value and the fix:

- the devices: `local.accelerator` and `eval_device` name a device this machine has (`check_devices`);
- the model's pretrained weights can be read (from the cache, or downloaded): `ModelSpec.preflight`.

A missing data folder is found by the data source itself, which runs before the run folder is created
(`Federation._fit`). Every problem found is reported together in one `PreflightError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flsuite.models.heads import ModelSpec

#: Lightning accelerator names that need no device beyond the CPU (`auto` picks whatever is there).
_ALWAYS_AVAILABLE = ("cpu", "auto")


class PreflightError(ValueError):
    """A setting this machine cannot run; `keys` are the dotted config keys at fault (to name the file setting them)."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


def machine_devices() -> str:
    """What this machine offers torch, in words: e.g. "cpu only; CUDA not available", "cpu and CUDA (2 GPUs)"."""
    if torch.cuda.is_available():
        return f"cpu and CUDA ({torch.cuda.device_count()} GPU(s))"
    if _mps_available():
        return "cpu and MPS (CUDA not available)"
    return "cpu only; CUDA not available"


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def accelerator_available(name: str) -> bool:
    """Whether Lightning's accelerator `name` can run here ("gpu" = CUDA or MPS, as Lightning resolves it). A name
    Lightning does not know counts as unavailable."""
    name = name.lower()
    if name in _ALWAYS_AVAILABLE:
        return True
    if name in ("gpu", "cuda"):
        return torch.cuda.is_available() or (name == "gpu" and _mps_available())
    if name == "mps":
        return _mps_available()
    from lightning.pytorch.accelerators import AcceleratorRegistry

    if name not in AcceleratorRegistry.available_accelerators():
        return False
    return bool(AcceleratorRegistry[name]["accelerator"].is_available())


def device_available(device: str) -> bool:
    """Whether a torch device string (`eval_device`: "cpu", "cuda", "cuda:1", "mps") names a device this machine has."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return False
    if parsed.type == "cuda":
        return torch.cuda.is_available() and (parsed.index is None or parsed.index < torch.cuda.device_count())
    if parsed.type == "mps":
        return _mps_available()
    return parsed.type == "cpu" or accelerator_available(parsed.type)


def check_devices(accelerator: str, eval_device: str) -> tuple[str, tuple[str, ...]] | None:
    """The problem with `local.accelerator` / `eval_device` on this machine, as (message, keys); None when both run."""
    bad = [
        (key, value)
        for key, value, ok in (
            ("local.accelerator", accelerator, accelerator_available),
            ("eval_device", eval_device, device_available),
        )
        if not ok(value)
    ]
    if not bad:
        return None
    named = " and ".join(f"{key} {value!r}" for key, value in bad)
    fix = " and ".join(f"{key}: cpu" for key, _ in bad)
    flags = " ".join(f"--{key} cpu" for key, _ in bad)
    verb = "need" if len(bad) > 1 else "needs"
    message = (
        f"{named} {verb} a device this machine does not have (it has {machine_devices()}); "
        f"set {fix} ({flags}), or run on a machine with that device"
    )
    return message, tuple(key for key, _ in bad)


def check_run(model: ModelSpec, accelerator: str, eval_device: str) -> None:
    """Run every check on a run's settings (`model`, `local.accelerator`, `eval_device`); raise one `PreflightError`
    with all the problems found."""
    from flsuite.models.weights import WeightsUnavailableError

    problems: list[str] = []
    keys: list[str] = []
    devices = check_devices(accelerator, eval_device)
    if devices is not None:
        problems.append(devices[0])
        keys.extend(devices[1])
    try:
        model.preflight("model")
    except WeightsUnavailableError as err:
        problems.append(str(err))
        keys.extend(err.keys)
    if problems:
        raise PreflightError(". Also: ".join(problems), tuple(keys))
