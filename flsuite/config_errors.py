"""An error from the user's input as one line (`user_error_message`): the key, and the config file or flag that set it.

jsonargparse's errors are made short: an unknown class name (`--method FedProxx`, a `class_path` typo) becomes one
line naming the key, the nearest known class and every known class for that key, instead of the union dump; an error
inside an optional (`X | None`) value loses the dump around it. A preflight, weights, data or missing-file error
gets the keys at fault and where they were set."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from flsuite.config_files import blame_config_file, parser_key, setter_of
from flsuite.runfolder import flatten

#: A class name jsonargparse could not resolve: a short name it does not know, or a class_path whose module lacks it.
_UNKNOWN = re.compile(
    r"Expected a dot import path string: (?P<name>\S+)"
    r"|Problem with given class_path '(?P<path>[^']+)': "
    r"(?:module '[^']+' has no attribute '[^']+'|No module named '(?P<module>[^']+)')"
)
_SUBTYPES = re.compile(r"Subtypes: \[(?:list\[)?(?:<class ')?([\w.]+)")
_OPTIONAL_DUMP = re.compile(
    r"(?:- Expected a path but \S+ either not accessible or invalid )?"
    r"-? ?Does not validate against any of the Union subtypes Subtypes: \[.*?\] Errors: - "
)
_NONE_TAIL = re.compile(r" - Expected a <class 'NoneType'> Given value type: .*$")


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _classes_in(hint: Any) -> list[type]:
    """The classes a type hint allows (`Method | None` -> [Method]; `list[SetupStage] | None` -> [SetupStage])."""
    if inspect.isclass(hint) and not isinstance(hint, types.GenericAlias):
        return [] if hint is type(None) else [hint]
    return [c for arg in typing.get_args(hint) for c in _classes_in(arg)]


def _base_classes(message: str) -> list[type]:
    """The classes the key of `message` accepts: from the union's listed subtypes, else from the type hint of the
    innermost key's parameter (of `Federation`, or of the class whose init_args hold it)."""
    listed = [c for c in (_import(p) for p in _SUBTYPES.findall(message)) if inspect.isclass(c)]
    if listed:
        return listed
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if not keys:
        return []
    owners = re.findall(r"Problem with given class_path '([^']+)': Parser key", message)
    if len(keys) > 1 and owners:
        owner = _import(owners[-1])
    else:
        from flsuite.federation.run import Federation

        owner = Federation
    try:
        hint = typing.get_type_hints(owner.__init__).get(keys[-1].split(".")[0])
    except (NameError, TypeError, AttributeError):
        return []
    return _classes_in(hint) if hint is not None else []


def known_classes(bases: list[type]) -> list[str]:
    """Short names of the concrete classes (the bases and their subclasses, as imported) a key accepts, sorted."""
    seen, stack = set(), list(bases)
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.add(cls)
            stack.extend(cls.__subclasses__())
    # LazyInstance_*: the subclasses jsonargparse's `lazy_instance` makes for defaults
    names = {
        c.__name__ for c in seen if not inspect.isabstract(c) and not c.__name__.startswith(("_", "LazyInstance_"))
    }
    return sorted(names, key=str.lower)


def unknown_class_message(message: str, key: str | None) -> str | None:
    """One line for an unknown class name in a jsonargparse error: the key, the name, the nearest known class
    (difflib) and the known classes; None when `message` is not about an unknown class name."""
    found = list(_UNKNOWN.finditer(message))
    if not found:
        return None
    hit = found[-1]
    name = hit.group("name") or hit.group("path")
    if hit.group("module") and not name.startswith(hit.group("module") + "."):
        return None  # the class's module exists but fails to import (a missing dependency): not a typo
    names = known_classes(_base_classes(message))
    if not names:
        return None
    short = name.rsplit(".", 1)[-1]
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(short.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f" (did you mean {by_lower[close[0]]}?)" if close else ""
    return (
        f"{key or 'class_path'}: unknown class {name!r}{hint}; "
        f"the known classes for {key or 'this key'}: {', '.join(names)}"
    )


def without_optional_dump(message: str) -> str:
    """An error about an optional value (`X | None`) without jsonargparse's union dump around it: the prefix, then
    X's own error (`... Union subtypes ... Errors: - ERR - Expected a <class 'NoneType'> Given value ...` -> ERR)."""
    if "Expected a <class 'NoneType'>" not in message or not _OPTIONAL_DUMP.search(message):
        return message
    return _NONE_TAIL.sub("", _OPTIONAL_DUMP.sub("", message, count=1))


def one_paragraph(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def user_error_message(caught: BaseException, files: list[Path], argv: list[str], parsed: Namespace | None) -> str:
    """The one line `flsuite` prints for a user error: the error (or the preflight/weights error it wraps), the keys
    at fault and where they were set; `parsed`: the parsed command line, when parsing got that far."""
    from flsuite.data.base import DataError
    from flsuite.data.image_decode import UnreadableImageError
    from flsuite.models.weights import WeightsUnavailableError
    from flsuite.preflight import PreflightError

    err = self_explaining_cause(caught)
    message = one_paragraph(err)
    if isinstance(err, argument_errors()):
        message = argument_error_message(message, files, argv)
    elif isinstance(err, (PreflightError, WeightsUnavailableError)):
        message += keys_set_where(err.keys, argv)
    elif isinstance(err, (DataError, FileNotFoundError)) and parsed is not None:
        message += keys_set_where(keys_naming_a_path(parsed, message), argv)
    if isinstance(err, UnreadableImageError):
        message += " (set data.init_args.skip_unreadable: true to drop unreadable images with a warning)"
    return message


def argument_error_message(message: str, files: list[Path], argv: list[str]) -> str:
    """jsonargparse's error as one line naming the key and the file (or flag) that set it: an unknown class name
    with the nearest and the known class names; an error in an optional value without the union dump."""
    key = parser_key(message)
    where = blame_config_file(message, files, argv)
    unknown = unknown_class_message(message, key)
    if unknown is not None:
        return unknown + where
    return without_optional_dump(message) + where


def keys_set_where(keys: Sequence[str], argv: list[str]) -> str:
    """Where config keys were set, grouped: " (local.accelerator and eval_device set in run.yaml)"; "" if nowhere."""
    by_place: dict[str, list[str]] = {}
    for key in keys:
        if (where := setter_of(key, argv)) is not None:
            by_place.setdefault(where, []).append(key)
    return "".join(
        f" ({', '.join(k[:-1]) + ' and ' if len(k) > 1 else ''}{k[-1]} set {where})" for where, k in by_place.items()
    )


def keys_naming_a_path(cfg: Namespace, message: str) -> list[str]:
    """The config keys whose value is a path that `message` names (as written, or resolved as a data path)."""
    from flsuite.paths import data_path

    found = []
    for key, value in flatten(cfg[cfg.command].as_dict()).items():
        if key == "config" or not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            continue
        if os.sep in str(value) and (str(value) in message or str(data_path(os.fspath(value))) in message):
            found.append(key)
    return found


def self_explaining_cause(err: BaseException) -> BaseException:
    """The error to report: a preflight or weights error that `err` wraps (jsonargparse wraps errors raised while it
    instantiates classes, e.g. a frozen encoder loading its weights, in a union dump), else `err` itself."""
    from flsuite.models.weights import WeightsUnavailableError
    from flsuite.preflight import PreflightError

    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, (PreflightError, WeightsUnavailableError)):
            return cause
        cause = cause.__cause__ or cause.__context__
    return err


def argument_errors() -> type[BaseException]:
    from argparse import ArgumentError

    from jsonargparse import ArgumentError as JArgumentError

    return (ArgumentError, JArgumentError)  # type: ignore[return-value]
