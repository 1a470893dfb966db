"""Docs that list repository files stay in step with them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def sweep_table(text: str) -> dict[str, list[str]]:
    """docs/sweeps.md's "The sweep files" table: file name -> its cells (method, swept options, metric, configs)."""
    section = text.split("## The sweep files", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # less the header and its rule
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        assert name, f"docs/sweeps.md: a table row's first cell is not a `file` name: {row}"
        assert name.group(1) not in table, f"docs/sweeps.md lists {name.group(1)} twice"
        table[name.group(1)] = cells[1:]
    return table


def test_the_sweeps_table_lists_every_file_in_sweeps_with_its_method_and_metric():
    table = sweep_table((ROOT / "docs" / "sweeps.md").read_text())
    files = {p.name: yaml.safe_load(p.read_text()) for p in (ROOT / "sweeps").glob("*.yaml")}
    assert sorted(table) == sorted(files), (
        f"not in the table: {sorted(set(files) - set(table))}; no such file: {sorted(set(table) - set(files))}"
    )
    for name, cfg in files.items():
        method, _, metric, _ = table[name]
        assert method.startswith(cfg["method"]), (
            f"{name}: the table says {method!r}, the file's method is {cfg['method']}"
        )
        assert metric == f"`{cfg['metric']['name']}`", (
            f"{name}: the table says {metric}, the file's metric is {cfg['metric']['name']}"
        )


def test_the_table_parser_sees_a_missing_file():
    """The check above can fail: a table without one of the files does not match sweeps/."""
    text = (ROOT / "docs" / "sweeps.md").read_text()
    shortened = "\n".join(line for line in text.splitlines() if not line.startswith("| `moon.yaml`"))
    assert "moon.yaml" in sweep_table(text) and "moon.yaml" not in sweep_table(shortened)
