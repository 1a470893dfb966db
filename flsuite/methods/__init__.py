"""The FL methods: one module each, or a package where a method is several stages (`fkpl/`).

Old module paths keep working (one mechanism, `MOVED`): a finder on `sys.meta_path` answers `import
flsuite.methods.<old>` with a module that looks every name up in the modules it moved to, and warns once
(DeprecationWarning) where it is imported. FKPL's `class_path`, `flsuite.methods.fkpl.FKPL`, is the package's own and
needs no alias; `fkpl_stages`, `fkpl_calibrate`, `fkpl_cluster`, `fkpl_model` and `fkpl_subspace` became modules of it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: Modules of Lightning classes only, imported by the fits that use them (FedGen's and FedCiR's generator fit); the
#: fit parser leaves them unimported (`flsuite.cli_parsers.not_configurable`).
NOT_CONFIGURABLE = ("generator_fit",)

_FKPL = "flsuite.methods.fkpl"
#: Old module → the modules its names live in now (looked up in this order).
MOVED: dict[str, tuple[str, ...]] = {
    "flsuite.methods.fkpl_stages": (f"{_FKPL}.clustering", f"{_FKPL}.experts", f"{_FKPL}.costs"),
    "flsuite.methods.fkpl_calibrate": (f"{_FKPL}.calibrate", f"{_FKPL}.prototypes", f"{_FKPL}.head", f"{_FKPL}.costs"),
    "flsuite.methods.fkpl_cluster": (f"{_FKPL}.cluster", f"{_FKPL}.settings"),
    "flsuite.methods.fkpl_model": (f"{_FKPL}.model",),
    "flsuite.methods.fkpl_subspace": (f"{_FKPL}.subspace", f"{_FKPL}.settings"),
    "flsuite.methods.base": ("flsuite.federation.method",),
}


class _MovedModule(importlib.abc.Loader):
    """Loads an old path as a module whose attributes are those of the modules it moved to."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        old, homes = module.__name__, MOVED[module.__name__]
        warnings.warn(f"{old} is now {' / '.join(homes)}; import from there", DeprecationWarning, stacklevel=2)
        module.__getattr__ = _lookup(old, [importlib.import_module(h) for h in homes])  # type: ignore[method-assign]


def _lookup(old: str, homes: Sequence[ModuleType]) -> Any:
    def getattr_(name: str) -> Any:
        for home in homes:
            if hasattr(home, name):
                return getattr(home, name)
        raise AttributeError(
            f"module {old!r} (moved to {', '.join(h.__name__ for h in homes)}) has no attribute {name!r}"
        )

    return getattr_


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, _MovedModule()) if fullname in MOVED else None


if not any(type(f).__name__ == _MovedFinder.__name__ for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
