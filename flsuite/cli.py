"""The `flsuite` command line (jsonargparse).

    flsuite fit --config run.yaml [--config more.yaml] [--dotted.key=value ...] [--resume RUN_DIR|CHECKPOINT]
    flsuite fit --config run.yaml --print_config        # the resolved config; feeding it back runs the same
    flsuite features --config run.yaml                  # build/embed the data once (fills the feature cache)

Pluggable parts (data, model, method, executor, setup stages) are chosen with `class_path`/`init_args`, or by short
class name (`--method FedProx`, `--executor RayExecutor`): every flsuite module is imported when the parser is built,
so jsonargparse knows every subclass and `flsuite fit --help` lists them (the parsers: flsuite.cli_parsers). Errors
in the config or in the data name the offending key and the file (or flag) that set it and exit with status 2, before
any work where they can be found then (flsuite.preflight; docs/errors.md); set FLSUITE_DEBUG=1 for the full traceback.
Ctrl-C during `fit` writes the last completed round's checkpoint and exits with status 130 (see flsuite.interrupts).

Start-up: each command imports what it runs (no torch or Lightning for `--version`, `--help` or the tools); `fit --help`
is cached (`flsuite.config_files.caching_help`); `features` on a filled cache answers from its index before any parser.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from jsonargparse import ArgumentParser, Namespace

from flsuite import progress
from flsuite.cli_parsers import TOOLS, fit_parser, main_parser
from flsuite.config_errors import argument_errors, one_paragraph, user_error_message
from flsuite.config_files import cached_help, caching_help, check_config_files, config_files, is_help_request
from flsuite.data import cache_index  # stats and JSON only
from flsuite.fit_data import build_federation, fit_federation  # noqa: F401 - build_federation: the tools' name for it
from flsuite.interrupts import EXIT_INTERRUPTED, RunInterrupted, sigint_raises_run_interrupted
from flsuite.runfolder import check_resume_config, flatten, previous_config
from flsuite.runtime import keep_freed_memory

if TYPE_CHECKING:
    from flsuite.federation.run import Federation

log = logging.getLogger("flsuite")


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that come from the user's input (config, data, checkpoint) and get a one-paragraph message (imported
    when an error is being reported: their modules import torch)."""
    from flsuite.data.base import DataError
    from flsuite.data.image_decode import UnreadableImageError
    from flsuite.federation.checkpoint import CheckpointError
    from flsuite.federation.phases import ClientFailedError
    from flsuite.models.weights import WeightsUnavailableError

    return (
        DataError,
        CheckpointError,
        ClientFailedError,
        FileNotFoundError,
        UnreadableImageError,
        WeightsUnavailableError,
        ValueError,
        TypeError,
    )


def resolved_config_yaml(parser: ArgumentParser, cfg: Namespace) -> str:
    """The resolved config as YAML, without the invocation-only keys (config files, --resume)."""
    cfg = cfg.clone()
    for key in ("config", "resume", "__path__"):
        if key in cfg:
            del cfg[key]
    return parser.dump(cfg, skip_unset=False)


def federation_from_configs(*configs: str | Path, args: Sequence[str] = ()) -> Federation:
    """The Federation `flsuite fit --config A --config B ... ARGS` would run, built but not started, quiet (no
    progress bar, no W&B): for tools and tests that inspect a config's data, clusters or loop without training."""
    parser = fit_parser()
    argv = [a for c in configs for a in ("--config", str(c))] + [
        "--progress",
        "false",
        "--wandb.enabled",
        "false",
        *args,
    ]
    return build_federation(parser, parser.parse_args(argv))


def option_defaults() -> dict[str, Any]:
    """Every `flsuite fit` option's default, as flattened dotted keys (for runs started before an option existed)."""
    parser = fit_parser()
    return flatten(yaml.safe_load(parser.dump(parser.get_defaults(), skip_check=True)) or {})


def check_resume(resume: Path, config_yaml: str) -> None:
    """`--resume` continues the same experiment: the checkpoint's config (else its folder's config.yaml) against the
    resolved one, before anything is built or written (`flsuite.runfolder.check_resume_config`)."""
    from flsuite.federation.checkpoint import resolve_checkpoint, run_dir_of, saved_config

    checkpoint = resolve_checkpoint(resume)
    old = previous_config(saved_config(checkpoint), run_dir_of(checkpoint))
    check_resume_config(old, config_yaml, resume, defaults=option_defaults)


def run_fit(parser: ArgumentParser, cfg: Namespace) -> dict[str, object]:
    config_yaml = resolved_config_yaml(parser, cfg)
    federation = fit_federation(parser, cfg, config_yaml)
    if cfg.resume is not None:
        check_resume(cfg.resume, config_yaml)
    with sigint_raises_run_interrupted():
        summary = federation.fit(resume=cfg.resume, config_yaml=config_yaml)
    print(f"\nPer-domain test accuracy (%), run folder {summary['run_dir']}:\n{summary['table']}")
    return summary


def run_features(parser: ArgumentParser, cfg: Namespace, argv: Sequence[str] = ()) -> dict[str, object]:
    """Build (and so embed and cache) the federation's data exactly as `fit` would, and report what was built; with
    the config's `progress`, bars on stderr as in `fit`. A build the feature cache's index holds as unchanged is
    reported from it (`flsuite.data.cache_index`); a finished build of an indexable source is recorded in it."""
    start = time.perf_counter()
    resolved = yaml.safe_load(resolved_config_yaml(parser, cfg))
    keys = [
        cache_index.request_key(resolved),
        *([cache_index.command_line_key(argv, config_files(list(argv)))] if argv else []),
    ]
    cache_dir = cache_index.resolved_cache_dir(resolved)
    if cache_dir is not None and (hit := cache_index.lookup(cache_dir, keys[0])) is not None:
        return cache_index.rewrite(cache_dir, keys[1:], hit).answer(start)
    init = parser.instantiate(cfg)
    from flsuite.seeding import resolve_seeds

    start = time.perf_counter()
    with progress.shown(cfg.progress), cache_index.recording() as used:
        seed = resolve_seeds(cfg.seed, cfg.data_seed, cfg.train_seed).data  # the clients' data: the data seed
        data = init.validation.apply(init.data.build(seed), seed)
    seconds = time.perf_counter() - start
    n_train = sum(len(c.train) for c in data.clients)
    n_test = sum(len(s) for s in data.test.values())
    n_val = sum(len(s) for s in data.validation.values())  # held out of the clients' training splits
    report = {
        "clients": len(data.clients),
        "train_samples": n_train,
        "test_samples": n_test,
        **({"validation_samples": n_val} if n_val else {}),
        "input_shape": list(data.input_shape),
        "seconds": round(seconds, 2),
        "samples_per_s": round((n_train + n_test + n_val) / max(seconds, 1e-9), 1),
    }
    print(json.dumps(report, indent=2))
    if cache_dir is not None and used.caches and (folders := init.data.source_folders()) is not None:
        cache_index.record(
            cache_dir,
            keys,
            sum(rows for _, rows in used.caches),
            report,
            folders,
            [path for path, _ in used.caches],
            used.pools,
        )
    return report


def interrupted_message(err: BaseException) -> str:
    """What to tell the user after Ctrl-C: the checkpointed round and the exact command to continue."""
    run_dir = getattr(err, "run_dir", None)
    if run_dir is None:
        return "flsuite: interrupted"
    from flsuite.federation.checkpoint import CHECKPOINT_NAME

    if not (Path(run_dir) / "checkpoints" / CHECKPOINT_NAME).is_file():
        return (
            f"flsuite: interrupted before a round was checkpointed (run folder {run_dir}); nothing to continue, "
            f"start the run again (remove {run_dir} first to reuse it as --run_dir)"
        )
    return (
        f"flsuite: interrupted; the last completed round is checkpointed in {run_dir}; "
        f"continue with --resume {run_dir} "
        f"(e.g. flsuite fit --config {Path(run_dir) / 'config.yaml'} --resume {run_dir})"
    )


def run_tool(name: str, argv: list[str], debug: bool) -> int:
    """Run `flsuite sweep|compare`: user errors as one paragraph (exit 2), Ctrl-C as 130 (a sweep resumes when
    rerun)."""
    module = importlib.import_module(TOOLS[name][0])
    try:
        return int(module.main(argv) or 0)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    except KeyboardInterrupt:
        print(
            f"flsuite {name}: interrupted"
            + ("; rerun the same command to resume the sweep" if name == "sweep" else ""),
            file=sys.stderr,
        )
        return 130
    except Exception as err:  # noqa: BLE001 - turned into a one-paragraph message below
        if debug or not isinstance(err, user_errors()):
            raise
        print(f"flsuite {name}: error: {one_paragraph(err)}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    keep_freed_memory()
    debug = bool(os.environ.get("FLSUITE_DEBUG"))
    tool_argv = sys.argv[1:] if argv is None else list(argv)
    if tool_argv and tool_argv[0] in TOOLS:  # sweep / compare: their own parsers
        return run_tool(tool_argv[0], tool_argv[1:], debug)
    argv = sys.argv[1:] if argv is None else list(argv)
    if is_help_request(argv) and (text := cached_help(argv)) is not None:
        sys.stdout.write(text)
        return 0
    files = config_files(argv)
    if argv[:1] == ["features"] and (hit := cache_index.lookup_command_line(argv[1:], files)) is not None:
        hit.answer(start)
        return 0
    parser = main_parser(argv[:1])
    parsed = None
    try:
        check_config_files(files)
        with caching_help(argv) if is_help_request(argv) else contextlib.nullcontext():
            cfg = parsed = parser.parse_args(argv)
        commands: dict[str, Any] = {"fit": run_fit, "features": functools.partial(run_features, argv=argv[1:])}
        assert parser._subcommands_action is not None  # the parser is built with its subcommands
        subparser = parser._subcommands_action._name_parser_map[cfg.command]
        commands[cfg.command](subparser, cfg[cfg.command])
        return 0
    except SystemExit as done:  # --help, --print_config
        return int(done.code or 0)
    except (KeyboardInterrupt, RunInterrupted) as err:
        print(interrupted_message(err), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as caught:  # noqa: BLE001 - turned into a one-line message below
        if debug or not isinstance(caught, (*user_errors(), argument_errors())):
            raise
        print(f"flsuite: error: {user_error_message(caught, files, argv, parsed)}", file=sys.stderr)
        return 2


def command() -> int:
    """The `flsuite` console script and `python -m flsuite.cli`: `main`, then `gc.freeze()` so that the interpreter's
    teardown does not run its final collections over torch's and Lightning's objects, 1.2-1.3 s of every training
    process's exit (docs/performance.md, "Start-up"). Atexit handlers, thread joins and reference-counted clean-up
    still run; only cyclic garbage left at exit goes uncollected, which the OS frees. Not in `main`: a process that
    runs many commands (a warm study worker, a test) must keep collecting."""
    try:
        return main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    sys.exit(command())
