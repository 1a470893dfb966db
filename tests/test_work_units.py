"""tests/conftest.py's work units: what `-n auto` hands to a worker whole."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SHARED_PROCESS, work_unit

ROOT = Path(__file__).resolve().parents[1]
#: A test or fixture that takes the process's local Ray (tests/conftest.py `local_ray`).
TAKES_LOCAL_RAY = re.compile(r"def \w+\([^)]*\blocal_ray\b")


def test_every_module_on_the_local_ray_is_in_the_shared_unit():
    """A module whose tests take `local_ray` runs in the shared unit (else its worker starts a second local Ray and
    its kept workers); every module the unit names exists."""
    on_ray = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if TAKES_LOCAL_RAY.search(path.read_text())
    }
    assert len(on_ray) >= 5 and on_ray <= SHARED_PROCESS, sorted(on_ray - SHARED_PROCESS)
    assert all((ROOT / module).is_file() for module in SHARED_PROCESS), sorted(SHARED_PROCESS)
    shared = {work_unit(f"{module}::test_x[a]") for module in SHARED_PROCESS}
    assert len(shared) == 1 and work_unit("tests/test_cli.py::test_x") == "tests/test_cli.py" not in shared
