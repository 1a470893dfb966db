"""Run folders grouped for the comparison: by experiment (equal configs but for the seed and `EXECUTION_KEYS`), by
parent folder, or by config values; and the check that a labelled group holds seeds of one experiment."""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flsuite.compare.runs import Run, read_config
from flsuite.runfolder import ALLOWED_CHANGES, flatten


def group_by_parent(runs: Sequence[Path]) -> dict[str, list[Path]]:
    """Group run folders by their parent folder, labelled by its name (or its path below the common folder)."""
    parents = sorted({Path(r).parent for r in runs})
    names = [p.name for p in parents]
    if len(set(names)) < len(names):
        common = Path(os.path.commonpath([str(p) for p in parents]))
        names = [str(p.relative_to(common)) for p in parents]
    label = dict(zip(parents, names))
    groups: dict[str, list[Path]] = {}
    for r in sorted(runs):
        groups.setdefault(label[Path(r).parent], []).append(Path(r))
    return groups


#: Config keys that say how or where a run executed, not what it computed (the resume check's allowed changes, less
#: `last_k`, which changes the final numbers), plus the seeds (`seed`, `data_seed`, `train_seed`: runs of one experiment
#: over a grid of data and training seeds form one group) and `resume` (in a `--print_config` dump fed back).
EXECUTION_KEYS = (*(k for k in ALLOWED_CHANGES if k != "last_k"), "seed", "data_seed", "train_seed", "resume")


def experiment(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config as dotted keys, without the keys that do not change the experiment (`EXECUTION_KEYS`)."""
    return {k: v for k, v in flatten(config).items() if not any(fnmatch.fnmatchcase(k, p) for p in EXECUTION_KEYS)}


def _short(class_path: Any) -> str:
    return str(class_path).rsplit(".", 1)[-1]


def method_label(config: Mapping[str, Any]) -> str | None:
    """The method's class name joined with the setup stages' (`FedAvg+GGEUR`, as `tracking.run_labels`), from a
    resolved config; None when the config names no method."""
    method = config.get("method")
    if not isinstance(method, Mapping) or "class_path" not in method:
        return None
    stages = [
        _short(s["class_path"]) for s in config.get("setup") or [] if isinstance(s, Mapping) and "class_path" in s
    ]
    return "+".join([_short(method["class_path"]), *stages])


def _show(flat: Mapping[str, Any], key: str) -> str:
    if key not in flat:
        return "—"
    value = flat[key]
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)


def differing_keys(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """Dotted keys whose value (or presence) is not the same in every one of `flats`, sorted."""
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({_show(f, k) for f in flats}) > 1]


def group_by_experiment(runs: Sequence[Path]) -> dict[str, list[Path]]:
    """Group run folders by their config without the seed and `EXECUTION_KEYS`, labelled by method (+ setup stages)
    and, where several groups share a method, the keys that tell them apart; in the order of the sorted runs."""
    members: dict[str, list[Path]] = {}
    flats: dict[str, dict[str, Any]] = {}
    methods: dict[str, str] = {}
    for r in sorted(map(Path, runs)):
        config = read_config(r)
        method = method_label(config)
        flat = experiment(config) if method else {"(folder)": str(r.parent)}
        key = json.dumps(flat, sort_keys=True, default=str)
        members.setdefault(key, []).append(r)
        flats[key], methods[key] = flat, method or r.parent.name
    labels: dict[str, str] = {}
    for method in dict.fromkeys(methods.values()):
        keys = [k for k in members if methods[k] == method]
        shown = differing_keys([flats[k] for k in keys])  # none for a method's only group
        for k in keys:
            parts = ", ".join(f"{d}={_show(flats[k], d)}" for d in shown)
            labels[k] = f"{method} ({parts})" if parts else method
    return {labels[k]: paths for k, paths in members.items()}


def check_one_experiment(label: str, runs: Sequence[Run]) -> None:
    """Stop if a labelled group holds runs of different experiments (configs differing beyond the seed and
    `EXECUTION_KEYS`), naming the group and the keys (runs without a config.yaml cannot be told apart)."""
    if len(runs) > 1 and all(r.config for r in runs) and (keys := differing_keys([experiment(r.config) for r in runs])):
        shown = ", ".join(keys[:4]) + (f" (and {len(keys) - 4} more)" if len(keys) > 4 else "")
        raise ValueError(
            f"group {label!r} holds runs of different experiments (their config.yaml differ in {shown}), "
            "so it cannot be averaged as seeds of one; `flsuite compare` without --by groups runs by config"
        )


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """A dotted key of a resolved config (`method.init_args.mu`); a list (setup stages) is entered at its last item."""
    node: Any = config
    for part in key.split("."):
        node = node[-1] if isinstance(node, list) and node else node
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def group_by_config(runs: Sequence[Path], keys: Sequence[str]) -> dict[str, list[Path]]:
    """Group run folders by the values of config keys (from each run's config.yaml), e.g. a sweep's trials by the
    swept option; labelled `key=value, ...` with the last dotted part of each key."""
    groups: dict[str, list[Path]] = {}
    for r in sorted(runs):
        config = read_config(r)
        try:
            label = ", ".join(f"{k.rsplit('.', 1)[-1]}={config_value(config, k)}" for k in keys)
        except KeyError as err:
            raise KeyError(f"{Path(r) / 'config.yaml'}: no config key {err.args[0]!r} to group by") from None
        groups.setdefault(label, []).append(Path(r))
    return groups
