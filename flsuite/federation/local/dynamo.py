"""torch.compile plumbing of the compiled loop: a compiled copy of a function per parameter layout, the quiet
first import of torch's C++-extension module, and what dynamo raises when it cannot capture a loss."""

from __future__ import annotations

import functools
import logging
import re
import sys
import types
from collections.abc import Callable

import torch

Layout = tuple[type, tuple[tuple[str, torch.Size, torch.dtype, torch.device], ...]]


@functools.cache
def capture_errors() -> tuple[type[Exception], ...]:
    """What dynamo raises when it cannot capture a loss in one graph (`except capture_errors()`: dynamo, ~1 s of
    imports, is imported by the first compiled fit, not by every process that could run one)."""
    return (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


class _DropNoCudaRuntime(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


@functools.cache
def _import_cpp_extension_quietly() -> None:
    """Import `torch.utils.cpp_extension` before the process's first compilation, without its CUDA probe's warning.

    Inductor's CPU code generation imports that module (`cpp_builder._get_torch_related_args`, the first time it
    checks the CPU's vector ISA), and its import looks for a CUDA toolkit (`_find_cuda_home`): on a CUDA build of torch
    with `nvcc` or `CUDA_HOME` on a machine without a usable GPU it logs "No CUDA runtime is found, using
    CUDA_HOME=…" once per process, a warning about nothing the CPU compiled loop uses. The module is imported here once
    with that one message filtered from that one logger (`torch.utils.cpp_extension`); the filter is removed right
    after, so everything else the module logs, then or later, still reaches the user."""
    if "torch.utils.cpp_extension" in sys.modules:
        return
    probe, quiet = logging.getLogger("torch.utils.cpp_extension"), _DropNoCudaRuntime()
    probe.addFilter(quiet)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        probe.removeFilter(quiet)


def compiled_copy(fn: Callable, layout: Layout, count: int) -> Callable:
    """`fn` compiled as its own function object and code object, named after the client class of `layout`.

    Dynamo keeps its graphs (and counts recompilations against `torch._dynamo.config.recompile_limit`) per code
    object, so each layout gets its own copy of the code: a process that runs several methods or models (a test
    session, an in-process sweep) never exhausts one shared budget, and a fit reuses the graph of the earlier fits
    of its kind."""
    _import_cpp_extension_quietly()
    name = f"{fn.__name__}_{layout[0].__name__}_{count}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)  # new code, same bytecode; dynamo's
    copy = types.FunctionType(code, fn.__globals__, name)  # automatic-dynamic state is keyed by name too
    return torch.compile(copy, fullgraph=True, dynamic=False)


def first_line(error: Exception, limit: int = 400) -> str:
    """The reason in dynamo's message: the operation that failed under fake tensors if it names one, else its first
    line."""
    text = str(error)
    inner = re.search(r"got (\w+Error)\('(.+?)'\)", text, re.DOTALL)
    if inner:
        text = f"{inner.group(1)}: {inner.group(2)}"
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().endswith("raised:")]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
