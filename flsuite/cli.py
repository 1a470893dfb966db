"""The `flsuite` command line (jsonargparse).

    flsuite fit --config run.yaml [--config more.yaml] [--dotted.key=value ...] [--resume RUN_DIR|CHECKPOINT]
    flsuite fit --config run.yaml --print_config        # the resolved config; feeding it back runs the same
    flsuite features --config run.yaml                  # build/embed the data once (fills the feature cache)

Pluggable parts (data, model, method, executor) are chosen with `class_path`/`init_args`. Errors in the config or in
the data name the offending key or file and exit with status 2; set FLSUITE_DEBUG=1 for the full traceback.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import time
from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from flsuite.data.base import DataError
from flsuite.data.image_folder import UnreadableImageError
from flsuite.federation.checkpoint import CheckpointError
from flsuite.federation.loop import ClientFailedError, Federation
from flsuite.runtime import keep_freed_memory

log = logging.getLogger("flsuite")

#: Errors that come from the user's input (config, data, checkpoint) and get a one-paragraph message.
USER_ERRORS = (DataError, CheckpointError, ClientFailedError, FileNotFoundError, UnreadableImageError, ValueError, TypeError)


def fit_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="flsuite fit",
        description="Train a federation round by round and record it (run folder + W&B).",
        exit_on_error=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file(s); later ones override earlier ones.")
    parser.add_class_arguments(Federation, fail_untyped=True, sub_configs=True)
    parser.add_argument("--resume", type=Path | None, default=None, help="Continue a run from its folder or a checkpoint file.")
    return parser


def main_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="flsuite", description="Federated learning experiments on heterogeneous clients.", exit_on_error=False)
    subcommands = parser.add_subcommands(dest="command")
    subcommands.add_subcommand("fit", fit_parser(), help="Run a federation from a YAML config.")
    subcommands.add_subcommand(
        "features", fit_parser(), help="Build the config's data once (embedding it with its frozen encoder into the feature cache) and report it."
    )
    return parser


def resolved_config_yaml(parser: ArgumentParser, cfg: Namespace) -> str:
    """The resolved config as YAML, without the invocation-only keys (config files, --resume)."""
    cfg = cfg.clone()
    for key in ("config", "resume", "__path__"):
        if key in cfg:
            del cfg[key]
    return parser.dump(cfg, skip_unset=False)


def build_federation(parser: ArgumentParser, cfg: Namespace) -> Federation:
    init = parser.instantiate(cfg)
    names = [p for p in inspect.signature(Federation.__init__).parameters if p != "self"]
    return Federation(**{name: init[name] for name in names})


def run_fit(parser: ArgumentParser, cfg: Namespace) -> dict[str, object]:
    federation = build_federation(parser, cfg)
    summary = federation.fit(resume=cfg.resume, config_yaml=resolved_config_yaml(parser, cfg))
    print(f"\nPer-domain test accuracy (%), run folder {summary['run_dir']}:\n{summary['table']}")
    return summary


def run_features(parser: ArgumentParser, cfg: Namespace) -> dict[str, object]:
    """Build (and so embed and cache) the federation's data exactly as `fit` would, and report what was built."""
    init = parser.instantiate(cfg)
    start = time.perf_counter()
    data = init.data.build(cfg.seed)
    seconds = time.perf_counter() - start
    n_train = sum(len(c.train) for c in data.clients)
    n_test = sum(len(s) for s in data.test.values())
    report = {"clients": len(data.clients), "train_samples": n_train, "test_samples": n_test, "input_shape": list(data.input_shape),
              "seconds": round(seconds, 2), "samples_per_s": round((n_train + n_test) / max(seconds, 1e-9), 1)}
    print(json.dumps(report, indent=2))
    return report


def _one_paragraph(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    keep_freed_memory()
    debug = bool(os.environ.get("FLSUITE_DEBUG"))
    parser = main_parser()
    try:
        cfg = parser.parse_args(argv)
        commands = {"fit": run_fit, "features": run_features}
        subparser = parser._subcommands_action._name_parser_map[cfg.command]
        commands[cfg.command](subparser, cfg[cfg.command])
        return 0
    except SystemExit as done:  # --help, --print_config
        return int(done.code or 0)
    except KeyboardInterrupt:
        print("flsuite: interrupted; the last completed round is checkpointed (continue with --resume RUN_DIR)", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - turned into a one-paragraph message below
        if debug or not isinstance(err, (*USER_ERRORS, _argument_error())):
            raise
        print(f"flsuite: error: {_one_paragraph(err)}", file=sys.stderr)
        return 2


def _argument_error() -> type[BaseException]:
    from argparse import ArgumentError

    from jsonargparse import ArgumentError as JArgumentError

    return (ArgumentError, JArgumentError)  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main())
