"""One run per folder: creating run folders, refusing to reuse one, and checking that `--resume` continues the same
experiment.

Decisions:
- A default run folder is `<output_dir>/<name>/<YYYYmmdd-HHMMSS>-seed<seed>-<4 hex>`, created with
  `mkdir(exist_ok=False)` and a fresh random suffix on collision, so runs started in the same second (parallel sweep
  agents) never share a folder.
- A folder "holds a run" when it has `config.yaml`, `metrics.jsonl` or `checkpoints/`. Such a `--run_dir` is refused
  (nothing in it is touched) unless the run is resumed; `config.yaml` is then written with exclusive creation, so of two
  runs racing for one fresh `--run_dir` the second stops.
- A new run's folder is created only once its data is built and its setup stages ran (`Federation._fit`): a run that
  fails before that leaves no folder and no W&B run; a `--run_dir` holding a run is still refused first, before any
  work.
- `--resume` compares the new resolved config with the checkpointed one, key by key (dotted keys). Keys that only say
  how or where a run is executed and recorded are allowed (`ALLOWED_CHANGES`, plus `rounds` when extended); every
  other difference (seed, data, model, method, local, setup, sampling, evaluation cadence, ... and any key unknown
  here) changes the experiment and stops the resume before anything in the folder is rewritten.
"""

from __future__ import annotations

import fnmatch
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

#: Files whose presence means a folder already holds a run.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints")

#: Dotted-key patterns (fnmatch) that may differ on `--resume`: where and how a run executes and is recorded, and what
#: is only computed from its history at the end. `rounds` is handled apart (allowed only when extended).
ALLOWED_CHANGES = (
    "run_dir",
    "output_dir",
    "name",
    "progress",
    "wandb",
    "wandb.*",
    "executor",
    "executor.*",
    "threads",
    "threads.*",
    "checkpoint_every",
    "eval_device",
    "on_client_failure",
    "last_k",
    "target_acc",
    "data.init_args.cache_dir",
    "local.accelerator",
)


class RunFolderError(ValueError):
    """A run folder cannot be used as asked (it holds another run, or a resume would change the experiment)."""


def new_run_dir(output_dir: Path, name: str, seed: int | str) -> Path:
    """Create and return a fresh, uniquely named run folder under `<output_dir>/<name>/` (atomic: mkdir, no reuse);
    `seed`: the seed, or the seed part of the name (`flsuite.seeding.Seeds.label`: `seed0-train3`)."""
    parent = Path(output_dir) / name
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        label = seed if isinstance(seed, str) else f"seed{seed}"
        path = parent / f"{stamp}-{label}-{secrets.token_hex(2)}"
        try:
            path.mkdir(exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise RunFolderError(f"could not create a unique run folder under {parent}")


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / marker).exists() for marker in RUN_MARKERS)


def check_run_dir_free(run_dir: Path) -> Path:
    """An explicit `--run_dir` for a new run, checked but not created: refused (untouched) if it already holds a run."""
    run_dir = Path(run_dir)
    if holds_run(run_dir):
        found = [m for m in RUN_MARKERS if (run_dir / m).exists()]
        raise RunFolderError(
            f"run_dir {run_dir} already holds a run ({', '.join(found)}); continue it with --resume {run_dir}, "
            "or choose another run_dir (or leave it unset for a new folder under output_dir)"
        )
    return run_dir


def create_run_dir(run_dir: Path | None, output_dir: Path, name: str, seed: int | str) -> Path:
    """Create a checked run folder (`check_run_dir_free`), or for None a new uniquely named one (`new_run_dir`)."""
    if run_dir is None:
        return new_run_dir(output_dir, name, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def write_config(run_dir: Path, config_yaml: str, resumed: bool) -> None:
    """Write `config.yaml`: exclusively for a new run (a second run racing for the folder stops), replaced on resume."""
    path = Path(run_dir) / "config.yaml"
    if resumed:
        path.write_text(config_yaml)
        return
    try:
        with open(path, "x") as f:
            f.write(config_yaml)
    except FileExistsError:
        raise RunFolderError(
            f"run_dir {run_dir} was taken by another run while this one started; choose another run_dir"
        ) from None


# ---- resume: same experiment? ---------------------------------------------------------------------------------
def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings (and lists holding mappings, e.g. `setup`) as {dotted.key: leaf value}."""
    out: dict[str, Any] = {}
    if isinstance(cfg, Mapping):
        items = [(str(k), v) for k, v in cfg.items()]
    elif isinstance(cfg, list) and any(isinstance(v, (Mapping, list)) for v in cfg):
        items = [(str(i), v) for i, v in enumerate(cfg)]
    else:
        return {prefix: cfg}
    if not items and prefix:
        out[prefix] = cfg
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


@dataclass
class ConfigDiff:
    """Keys that differ between a run's config and the config it is resumed with."""

    blocking: list[str]
    allowed: list[str]


def _allowed(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in ALLOWED_CHANGES)


def compare_configs(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> ConfigDiff:
    """Classify every differing dotted key (present in one config only counts as differing), except a key the old
    config lacks because the option did not exist when that run started: it is unchanged when its new value is the
    option's default (`defaults`, flattened) or null."""
    a, b, defaults = flatten(old), flatten(new), defaults or {}
    blocking: list[str] = []
    allowed: list[str] = []
    for key in sorted(set(a) | set(b)):
        if key in a and key in b and a[key] == b[key]:
            continue
        if key not in a and (b[key] is None or (key in defaults and b[key] == defaults[key])):
            continue
        if key == "rounds" and isinstance(a.get(key), int) and isinstance(b.get(key), int):
            (allowed if b[key] > a[key] else blocking).append(key)
        elif key == "local.loop" and b.get(key) == "auto":
            allowed.append(key)  # `auto` resumes on the loop the run began with (`flsuite.federation.run_loop_choice`)
        elif _allowed(key):
            allowed.append(key)
        else:
            blocking.append(key)
    return ConfigDiff(blocking, allowed)


def check_resume_config(
    old_yaml: str, new_yaml: str, where: Path | str, defaults: Callable[[], Mapping[str, Any]] | None = None
) -> ConfigDiff:
    """Stop (RunFolderError naming the keys) if resuming with `new_yaml` would change the experiment of `old_yaml`;
    otherwise log which allowed keys changed. Either config empty (a run made through the API) = nothing to compare.
    `defaults()` gives every option's default as dotted keys (`flsuite.cli.option_defaults`), asked only when the old
    config lacks a key (a run started before the option existed)."""
    if not old_yaml or not new_yaml:
        return ConfigDiff([], [])
    old, new = yaml.safe_load(old_yaml) or {}, yaml.safe_load(new_yaml) or {}
    diff = compare_configs(old, new)
    if diff.blocking and defaults is not None and any(k not in flatten(old) for k in diff.blocking):
        diff = compare_configs(old, new, defaults())
    if diff.blocking:
        a, b = flatten(old), flatten(new)
        shown = "; ".join(f"{k}: {_show(a, k)} -> {_show(b, k)}" for k in diff.blocking[:8])
        more = f" (and {len(diff.blocking) - 8} more)" if len(diff.blocking) > 8 else ""
        raise RunFolderError(
            f"--resume {where}: the config changes the experiment, "
            f"so this would not continue the same run: {shown}{more}. "
            "Resume with the run's own config (its config.yaml), or start a new run without --resume"
        )
    if diff.allowed:
        log.warning(
            "--resume %s: continuing with changed settings that do not change the experiment: %s",
            where,
            ", ".join(diff.allowed),
        )
    return diff


def _show(flat: Mapping[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(absent)"


def previous_config(checkpoint_config: str, run_dir: Path) -> str:
    """The config a run was started with: the checkpoint's, else the folder's `config.yaml`."""
    if checkpoint_config:
        return checkpoint_config
    path = Path(run_dir) / "config.yaml"
    return path.read_text() if path.is_file() else ""
