"""What produced a run folder, and whether an existing run folder is the experiment a driver asks for.

A study driver (experiments/study.py, experiments/fedegg_study.py, `flsuite sweep`) that finds a run folder already
holding a run uses it only when `same_experiment` says so; otherwise it reruns the run (moving the old folder aside,
`move_aside`) or stops, and prints the reason either way.

Decisions:
- The code version: `flsuite.code_identity.code_version` (its decisions there).
- Same code = the same package version, the same commit and the same `uncommitted` fingerprint (null for a clean
  tree): a tree with uncommitted changes is the same code only when its changes are identical. A run without a
  recorded commit (made before flsuite recorded it, or outside a git checkout) is never the same code: nothing pins it.
- Same config = the folder's `config.yaml` (the resolved config `flsuite fit` wrote) equals the requested resolved
  config key by key (dotted keys), except `REUSE_IGNORED`: where the run is written and logged (`run_dir`,
  `output_dir`, `name`, `wandb.*`), the progress bar, the checkpoint cadence, the feature cache's folder, and the
  executor (serial or Ray give the same numbers, docs/scale-out.md). Every other key counts, including `seed`,
  `last_k` and `target_acc` (they change summary.json), `threads` and `local.accelerator`/`eval_device` (they change
  the last bits), and a key present on one side only (an option added since: the commits differ anyway).
- A resumed run (`flsuite fit --resume`) keeps the code that began it under `code` and appends each resume's code to
  `resumes` (`flsuite.run_environment.resumed_environment`). A run resumed under other code than it began with was made
  by more than one code version: `recorded_code` marks it (`resumed_by`, shown by `code_label`), `same_experiment` never
  reuses it and `code_mix` counts it apart.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from flsuite.code_identity import NOT_CODE, code_version, git_state, package_root  # noqa: F401 - re-exported
from flsuite.runfolder import flatten

#: Dotted-key patterns (fnmatch) that may differ between a reused run and the request (see the module's decisions).
REUSE_IGNORED = (
    "run_dir",
    "output_dir",
    "name",
    "progress",
    "wandb",
    "wandb.*",
    "checkpoint_every",
    "*cache_dir",
    "executor",
    "executor.*",
)


def code_label(code: Mapping[str, Any] | None) -> str:
    """A code version in short: `8465eba6c6`, `8465eba6c6 + uncommitted 9f2c01d3`, or `no commit recorded`; a run
    resumed under other code adds `, resumed by <label>`."""
    if not code or not code.get("commit"):
        label = "no commit recorded"
    else:
        label = str(code["commit"])[:10]
        label = f"{label} + uncommitted {str(code.get('uncommitted'))[:8]}" if code.get("dirty") else label
    resumed = code.get("resumed_by") if code else None
    return f"{label}, resumed by {', '.join(map(str, resumed))}" if resumed else label


def _same_code(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in ("version", "commit", "uncommitted"))


def environment_code(environment: Mapping[str, Any]) -> dict[str, Any] | None:
    """The code version of an environment.json's content: the code that began the run (None when it recorded none),
    with `resumed_by` (the labels of the other code versions that resumed it) when a resume ran other code."""
    code = environment.get("code")
    code = code if isinstance(code, dict) else None
    resumes = environment.get("resumes")
    later = [r.get("code") for r in resumes if isinstance(r, dict)] if isinstance(resumes, list) else []
    others = list(dict.fromkeys(code_label(c) for c in later if not _same_code(c, code)))
    if not others:
        return code
    return {**(code or {}), "resumed_by": others}


def recorded_code(run_dir: Path) -> dict[str, Any] | None:
    """The code version a run folder's environment.json recorded (`environment_code`; None when it recorded none)."""
    try:
        environment = json.loads((Path(run_dir) / "environment.json").read_text())
    except (OSError, ValueError):
        return None
    return environment_code(environment) if isinstance(environment, dict) else None


@dataclass(frozen=True)
class Reuse:
    """Whether a run folder is the requested experiment; `reason` says why not (or what makes it the same)."""

    same: bool
    reason: str


def _ignored(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in REUSE_IGNORED)


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for every dotted key (but `REUSE_IGNORED`) whose value or presence differs."""
    a, b = flatten(old), flatten(new)
    shown = []
    for key in sorted(set(a) | set(b)):
        if not _ignored(key) and (key not in a or key not in b or a[key] != b[key]):
            shown.append(f"{key}: {_side(a, key)} -> {_side(b, key)}")
    return shown


def _side(flat: Mapping[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(absent)"


def same_experiment(run_dir: Path, config_yaml: str, code: Mapping[str, Any] | None = None) -> Reuse:
    """Is the run in `run_dir` the experiment whose resolved config is `config_yaml`, run by this code (`code`,
    default `code_version()`)? Compares the folder's config.yaml and environment.json (the module's decisions)."""
    run_dir, code = Path(run_dir), code_version() if code is None else code
    reasons = []
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        reasons.append("it has no config.yaml")
    else:
        differ = config_differences(yaml.safe_load(config_file.read_text()) or {}, yaml.safe_load(config_yaml) or {})
        if differ:
            more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
            reasons.append(f"its config differs: {'; '.join(differ[:5])}{more}")
    old = recorded_code(run_dir)
    if old is not None and old.get("resumed_by"):
        reasons.append(f"it was resumed under other code than it began with ({code_label(old)})")
    elif old is None or not old.get("commit"):
        reasons.append(
            "it recorded no commit (made before flsuite recorded its code version, or outside a git checkout)"
        )
    elif not code.get("commit"):
        reasons.append("this code is not a git checkout (no commit to compare)")
    elif [old.get(k) for k in ("commit", "uncommitted", "version")] != [
        code.get(k) for k in ("commit", "uncommitted", "version")
    ]:
        reasons.append(
            f"it was made by code {code_label(old)} (flsuite {old.get('version')}), "
            f"this is {code_label(code)} (flsuite {code.get('version')})"
        )
    if reasons:
        return Reuse(False, "; ".join(reasons))
    return Reuse(True, f"same config and code ({code_label(code)})")


def move_aside(run_dir: Path) -> Path:
    """Move a run folder that is not reused into `<parent>/.replaced/<name>-<time>` (kept, out of the study's way:
    `flsuite compare` skips folders below a hidden one) and return the new path."""
    run_dir = Path(run_dir)
    target = run_dir.parent / ".replaced" / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    target.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while target.exists():
        target, n = target.with_name(f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    run_dir.rename(target)
    return target


def runs_code_mix(run_dirs: Sequence[Path]) -> str:
    """`code_mix` of the code versions the run folders recorded (`recorded_code`), for readers of run folders."""
    return code_mix([recorded_code(d) for d in dict.fromkeys(map(Path, run_dirs))])


def code_mix(codes: Sequence[Mapping[str, Any] | None]) -> str:
    """A warning when runs come from more than one code version (commit and uncommitted changes), naming each and
    how many runs it made; "" when they share one (or none recorded any)."""
    return _mix(Counter(map(code_label, codes)), "come from {} code versions", "a table should hold runs of one.")


def recorded_cpu(environment: Mapping[str, Any]) -> str | None:
    """The CPU capabilities (torch's vector instructions) an environment.json recorded: its start's, then any other a
    resume ran on, joined by " then "; None for a run made before they were recorded."""
    kinds = [environment.get("cpu_capability"), *(r.get("cpu_capability") for r in environment.get("resumes", []))]
    return " then ".join(dict.fromkeys(k for k in kinds if k)) or None


def cpu_mix(kinds: Sequence[str | None]) -> str:
    """A warning when runs were made on more than one kind of CPU (`recorded_cpu`; runs that recorded none left out),
    whose vector instructions decide the last bits of a CPU run's sums; "" otherwise."""
    return _mix(
        Counter(k for k in kinds if k),
        "were made on {} kinds of CPU (torch CPU capability)",
        "a rerun on one machine gives other last digits for some of them.",
    )


def _mix(counts: Counter[str], what: str, advice: str) -> str:
    """`Warning: these runs <what, with the number of labels>: label (n runs), …; <advice>`, the most frequent label
    first (ties by label); "" for fewer than two labels."""
    if len(counts) < 2:
        return ""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{label} ({n} run{'s' * (n != 1)})" for label, n in ordered)
    return f"Warning: these runs {what.format(len(counts))}: {shown}; {advice}"
