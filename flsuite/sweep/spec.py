"""A W&B sweep file read and checked into a spec, and the command a W&B agent would run for one trial's values."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flsuite.records import ACC_MEAN, LAST_PREFIX, PER_ROUND, VAL_PREFIX, round_key_of

METHODS = ("grid", "random", "bayes")
TOP_LEVEL_KEYS = {
    "program",
    "command",
    "method",
    "metric",
    "parameters",
    "early_terminate",
    "name",
    "description",
    "project",
    "entity",
    "run_cap",
    "controller",
}
DISTRIBUTIONS = ("uniform", "int_uniform", "log_uniform_values", "q_uniform", "categorical", "constant")
MACROS = ("${env}", "${interpreter}", "${program}", "${args}", "${args_no_hyphens}")
# PER_ROUND (flsuite.records): keys logged once per round (metrics.jsonl); every other metric name is looked up in
# summary.json.


class SweepError(ValueError):
    """A sweep file that flsuite (or W&B) cannot run; the message names the file and key."""


def load_sweep(path: Path) -> dict[str, Any]:
    """Read and check a W&B sweep file (structure, methods, distributions, metric, command); return it."""
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(cfg, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with method, metric, parameters and command")
    unknown = set(cfg) - TOP_LEVEL_KEYS
    if unknown:
        raise SweepError(
            f"{path}: unknown top-level key(s) {sorted(unknown)}; W&B sweep keys are {sorted(TOP_LEVEL_KEYS)}"
        )
    if cfg.get("method") not in METHODS:
        raise SweepError(f"{path}: method must be one of {METHODS}, got {cfg.get('method')!r}")
    metric = cfg.get("metric")
    if (
        not isinstance(metric, dict)
        or not isinstance(metric.get("name"), str)
        or metric.get("goal") not in ("maximize", "minimize")
    ):
        raise SweepError(
            f"{path}: metric must be {{name: <a key flsuite logs>, goal: maximize|minimize}}, got {metric!r}"
        )
    params = cfg.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError(f"{path}: parameters must be a non-empty mapping of option name -> spec")
    for name, spec in params.items():
        distribution(name, spec, path)
        if cfg["method"] == "grid" and "values" not in spec and "value" not in spec:
            raise SweepError(
                f"{path}: parameter {name!r}: a grid sweep needs `values` (or `value`) for every parameter"
            )
    command = cfg.get("command", ["${env}", "${interpreter}", "${program}", "${args}"])
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        raise SweepError(f"{path}: command must be a list of strings")
    if "${args}" not in command and "${args_no_hyphens}" not in command:
        raise SweepError(f"{path}: command must contain ${{args}} (where the agent puts --key=value)")
    if "${program}" in command and not cfg.get("program"):
        raise SweepError(f"{path}: command uses ${{program}} but the file has no program")
    early = cfg.get("early_terminate")
    if early is not None:
        if not isinstance(early, dict) or early.get("type") != "hyperband":
            raise SweepError(
                f"{path}: early_terminate must be {{type: hyperband, min_iter: ..., eta: ...}}, got {early!r}"
            )
        bad = {k: v for k, v in early.items() if k != "type" and not (isinstance(v, int) and v >= 1)}
        if bad or ("min_iter" not in early and "max_iter" not in early):
            raise SweepError(
                f"{path}: early_terminate hyperband needs min_iter or max_iter, all positive integers, got {early!r}"
            )
    if "run_cap" in cfg and not (isinstance(cfg["run_cap"], int) and cfg["run_cap"] >= 1):
        raise SweepError(f"{path}: run_cap must be a positive integer")
    return cfg


def distribution(name: str, spec: Any, path: Path | str = "sweep") -> str:
    """The W&B distribution of one parameter spec (checked), one of DISTRIBUTIONS."""
    where = f"{path}: parameter {name!r}"
    if not isinstance(spec, dict):
        raise SweepError(f"{where}: a spec is a mapping (values / value / min+max), got {spec!r}")
    if "parameters" in spec:
        raise SweepError(
            f"{where}: nested parameters are not supported; "
            "name the option with dots instead (e.g. method.init_args.mu)"
        )
    if "probabilities" in spec:
        raise SweepError(f"{where}: `probabilities` is not supported by flsuite sweep")
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: values must be a non-empty list")
        if any(v is None or isinstance(v, (dict, list)) for v in values):
            raise SweepError(
                f"{where}: values must be scalars "
                "(W&B renders null as 'None', which flsuite does not parse; use the string 'null')"
            )
        return "categorical"
    if "value" in spec:
        if spec["value"] is None or isinstance(spec["value"], (dict, list)):
            raise SweepError(f"{where}: value must be a scalar (use the string 'null' for None)")
        return "constant"
    if "min" not in spec or "max" not in spec:
        raise SweepError(f"{where}: give values, value, or min and max")
    lo, hi = spec["min"], spec["max"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)) or lo >= hi:
        raise SweepError(f"{where}: min and max must be numbers with min < max, got {lo!r}, {hi!r}")
    default = "int_uniform" if isinstance(lo, int) and isinstance(hi, int) else "uniform"
    dist = spec.get("distribution", default)
    if dist not in ("uniform", "int_uniform", "log_uniform_values", "q_uniform"):
        raise SweepError(
            f"{where}: distribution {dist!r} is not supported; "
            "use one of uniform, int_uniform, log_uniform_values, q_uniform"
        )
    if dist == "log_uniform_values" and lo <= 0:
        raise SweepError(f"{where}: log_uniform_values needs min > 0")
    if dist == "int_uniform" and not (isinstance(lo, int) and isinstance(hi, int)):
        raise SweepError(f"{where}: int_uniform needs integer min and max")
    return dist


def grid_size(cfg: Mapping[str, Any]) -> int:
    return math.prod(len(s["values"]) for s in cfg["parameters"].values() if "values" in s)


def args_flags(params: Mapping[str, Any], hyphens: bool = True) -> list[str]:
    """`--key=value` as W&B's agent renders `${args}` (Python's str() of each value), or `key=value`."""
    return [f"{'--' if hyphens else ''}{k}={v}" for k, v in params.items()]


def expand_command(cfg: Mapping[str, Any], params: Mapping[str, Any], interpreter: str = sys.executable) -> list[str]:
    """The command a W&B agent would run for `params`, with `${env}` dropped (the environment is passed instead),
    `${interpreter}` = this Python and a leading `flsuite` run as `python -m flsuite.cli` (the same interpreter)."""
    out: list[str] = []
    for token in map(str, cfg.get("command", ["${env}", "${interpreter}", "${program}", "${args}"])):
        if token == "${env}":
            continue
        if token == "${interpreter}":
            out.append(interpreter)
        elif token == "${program}":
            out.append(str(cfg["program"]))
        elif token == "${args}":
            out += args_flags(params)
        elif token == "${args_no_hyphens}":
            out += args_flags(params, hyphens=False)
        elif token.startswith("${"):
            raise SweepError(f"command macro {token} is not supported by flsuite sweep (use {', '.join(MACROS)})")
        else:
            out.append(token)
    if out and out[0] == "flsuite":
        out = [interpreter, "-m", "flsuite.cli", *out[1:]]
    return out


def fit_args(command: Sequence[str]) -> list[str] | None:
    """The arguments after `fit` when `command` runs `flsuite fit` (else None)."""
    for i, token in enumerate(command[:-1]):
        if token in ("flsuite.cli", "flsuite") and command[i + 1] == "fit":
            return list(command[i + 2 :])
        if token.endswith("flsuite/cli.py") and command[i + 1] == "fit":
            return list(command[i + 2 :])
    return None


def check_fit_args(args: Sequence[str], parser: Any = None) -> Any:
    """Parse `flsuite fit` arguments (what `--print_config` resolves); raise SweepError naming the bad key."""
    from flsuite.cli_parsers import fit_parser

    parser = parser or fit_parser()
    try:
        return parser.parse_args(list(args))
    except SystemExit as err:  # jsonargparse exits on some errors even with exit_on_error=False
        raise SweepError(f"flsuite fit {' '.join(args)}: invalid arguments (exit {err.code})") from None
    except Exception as err:  # noqa: BLE001 - reported with the arguments that caused it
        raise SweepError(f"flsuite fit {' '.join(args)}: {' '.join(str(err).split())}") from None


def per_round_key(metric: str) -> str:
    """The per-round key whose values stand in for `metric` while a trial runs (for hyperband)."""
    if PER_ROUND.fullmatch(metric):
        return metric
    tail = round_key_of(metric)  # last5/acc_mean, last/acc_mean, best/acc_mean -> acc_mean
    # A validation metric (last5/val/acc_mean) prunes on validation's own per-round key, never on the test one.
    return tail if PER_ROUND.fullmatch(tail.removeprefix(VAL_PREFIX)) else ACC_MEAN


def objective_value(summary: Mapping[str, Any], metric: str, where: Path) -> float:
    """`metric` from a trial's summary.json (a per-round key: its last round's value, as W&B's summary holds)."""
    for key in (metric, f"{LAST_PREFIX}{metric}"):
        if summary.get(key) is not None:
            return float(summary[key])
    raise SweepError(f"{where}: metric {metric!r} is not in the run's summary (keys: {', '.join(sorted(summary))})")
