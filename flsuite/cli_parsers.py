"""The `flsuite` command line's parsers: `flsuite fit`'s (every flsuite module imported first) and the top-level one."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser

import flsuite

log = logging.getLogger("flsuite")


def not_configurable(module: str) -> bool:
    """Whether `module`'s package lists it in its `NOT_CONFIGURABLE`: a module of Lightning classes only, built by the
    fits that use them and never named in a config, which the parser leaves unimported (and Lightning with it, which a
    run on the CPU's lean or compiled loop never needs: docs/performance.md, "A run's imports")."""
    package, _, name = module.rpartition(".")
    return name in getattr(sys.modules.get(package), "NOT_CONFIGURABLE", ())


def import_all_modules() -> list[str]:
    """Import every flsuite module so that jsonargparse knows every subclass (short names, `--help` listings), but
    those `not_configurable` (a package is imported before its modules are listed). A module whose optional dependency
    is missing is skipped (its classes then need the full class_path)."""
    skipped = []
    for info in pkgutil.walk_packages(flsuite.__path__, "flsuite."):
        if info.name in (__name__, "flsuite.cli") or not_configurable(info.name):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as err:  # an optional dependency
            skipped.append(f"{info.name} ({err})")
        except Exception as err:  # noqa: BLE001 - a broken module must not take the whole CLI down
            log.warning("flsuite module %s failed to import (%s); its classes need the full class_path", info.name, err)
    if skipped:
        log.debug("not importable, so not available by short name: %s", "; ".join(skipped))
    return skipped


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("flsuite")
    except Exception:  # a source tree that is not installed
        return flsuite.__version__


def fit_parser() -> ArgumentParser:
    from flsuite.federation.run import Federation

    import_all_modules()
    parser = ArgumentParser(
        prog="flsuite fit",
        description="Train a federation round by round and record it (run folder + W&B).",
        exit_on_error=False,
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML config file(s); later ones override earlier ones."
    )
    parser.add_class_arguments(Federation, fail_untyped=True, sub_configs=True)
    # The federation's own default is the base Method (FedAvg's hooks) so the engine needs no concrete method; the
    # command line names FedAvg, so resolved configs say what ran.
    from jsonargparse import lazy_instance

    from flsuite.methods.fedavg import FedAvg

    parser.set_defaults(method=lazy_instance(FedAvg))
    parser.add_argument(
        "--resume", type=Path | None, default=None, help="Continue a run from its folder or a checkpoint file."
    )
    return parser


def main_parser(commands: Sequence[str] = ("fit", "features")) -> ArgumentParser:
    """The `flsuite` parser; of `fit` and `features`, only those in `commands` get their real (heavy) parser, the others
    a placeholder that only lists them."""
    parser = ArgumentParser(
        prog="flsuite", description="Federated learning experiments on heterogeneous clients.", exit_on_error=False
    )
    parser.add_argument("--version", action="version", version=f"flsuite {version()}")
    subcommands = parser.add_subcommands(dest="command")
    parser_of = {
        name: fit_parser() if name in commands else ArgumentParser(exit_on_error=False) for name in ("fit", "features")
    }
    subcommands.add_subcommand("fit", parser_of["fit"], help="Run a federation from a YAML config.")
    subcommands.add_subcommand(
        "features",
        parser_of["features"],
        help=(
            "Build the config's data once (embedding it with its frozen encoder into the feature cache) and report it."
        ),
    )
    for name, (_, help_text) in TOOLS.items():  # listed in `flsuite --help`; `main` hands them to their own parsers
        subcommands.add_subcommand(name, ArgumentParser(prog=f"flsuite {name}", exit_on_error=False), help=help_text)
    return parser


#: Subcommands with their own (argparse) parsers, so that `flsuite fit` flags can follow `--`: name -> (module, help).
TOOLS = {
    "sweep": (
        "flsuite.sweep",
        "Run a W&B sweep file offline on optuna (SQLite study, resumable): flsuite sweep sweeps/<file>.yaml.",
    ),
    "compare": ("flsuite.compare", "Compare methods across run folders, globs or study folders (Markdown, HTML, PNG)."),
    "dashboard": (
        "flsuite.dashboard",
        'Build the W&B workspace that compares methods (or a sweep\'s view); needs pip install "flsuite[dashboard]".',
    ),
}
