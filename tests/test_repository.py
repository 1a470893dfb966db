"""Nothing of a developer's machine in the repository: no link out of the checkout, no absolute path of ours.

A tracked `.cache` link to a folder that existed only on the project's machines once made every encoder config (and
two tests) crash on any other machine, while CI, run where that folder existed, stayed green.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Top folders of developers' machines (Linux, macOS); named without their slash, so this file names no such path.
MACHINE_TOPS = ("work", "farm", "root", "home", "Users")
SLASH = "/"
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])" + re.escape(SLASH) + "(?:" + "|".join(MACHINE_TOPS) + r")" + re.escape(SLASH) + r"[\w.-]"
)
TEXT_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".md", ".toml", ".txt", ".cfg", ".ini", ""}


def tracked_files() -> list[tuple[str, str]]:
    """(mode, path) of every file git tracks in this checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.fail(f"the repository checks need a git checkout with git on PATH ({err})")
    return [(line.split()[0], line.split("\t", 1)[1]) for line in out.splitlines()]


def escaping_links(files: list[tuple[str, str]], root: Path = ROOT) -> list[str]:
    """Tracked symlinks whose target is absolute or resolves outside the checkout."""
    bad = []
    for mode, path in files:
        if mode != "120000":
            continue
        target = os.readlink(root / path)
        inside = (
            not os.path.isabs(target)
            and os.path.normpath(os.path.join(os.path.dirname(path), target)).split(os.sep)[0] != ".."
        )
        if not inside:
            bad.append(f"{path} -> {target}")
    return bad


def machine_paths(files: list[tuple[str, str]], root: Path = ROOT) -> list[str]:
    """`file:line: text` of every tracked text file line that names a developer machine's absolute path."""
    hits = []
    for mode, path in files:
        if mode == "120000" or Path(path).suffix not in TEXT_SUFFIXES or path == "tests/test_repository.py":
            continue
        try:
            text = (root / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        hits += [
            f"{path}:{n}: {line.strip()[:120]}"
            for n, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATH.search(line)
        ]
    return hits


def test_no_tracked_link_leaves_the_repository():
    assert not escaping_links(tracked_files()), (
        "tracked symlinks that point outside the checkout (remove them; create the folder at run time)"
    )


def test_no_tracked_file_names_a_developers_machine_path():
    hits = machine_paths(tracked_files())
    assert not hits, "absolute paths of a developer's machine in tracked files:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_guard(tmp_path):
    """The two detectors on a constructed checkout: an absolute link, a relative link out, a machine path."""
    (tmp_path / "docs").mkdir()
    machine_cache = SLASH + SLASH.join(("work", "cache"))
    machine_spec = SLASH + SLASH.join(("work", "shared", "methods", "fedegg.md"))
    (tmp_path / ".cache").symlink_to(machine_cache)
    (tmp_path / "docs" / "up").symlink_to("../../elsewhere")
    (tmp_path / "docs" / "ok").symlink_to("../README.md")
    (tmp_path / "docs" / "a.md").write_text(
        f"see {machine_spec}\nand {SLASH}tmp{SLASH}run is fine\nand ~{machine_cache} too\n"
    )
    files = [("120000", ".cache"), ("120000", "docs/up"), ("120000", "docs/ok"), ("100644", "docs/a.md")]
    assert escaping_links(files, tmp_path) == [f".cache -> {machine_cache}", "docs/up -> ../../elsewhere"]
    assert machine_paths(files, tmp_path) == [f"docs/a.md:1: see {machine_spec}"]
