"""The guiding classes' selection (spec A6): the class-mapping file, and the LH, MH or HH classes chosen from it.

A mapping file (JSON) ranks, for each FL class, the public classes most related to it — what GPT-4 returned in the
paper (Appendix B prompt, Table 5), shipped as data so that nothing calls an LLM:

    {"fl_classes": ["airplane", ...], "mapping": {"airplane": ["n04552348", "n02690373", ...], ...}}

Selection rule (spec A6), `select_classes`:
- LH: ranks 1..`per_class` of every FL class, rank by rank over the FL classes in file order; a class already taken
  falls through to that FL class's next rank (Table 5's duplicates). With `size`, a seeded choice of `size` of them
  (CIFAR-100: rank 1 of 100 classes, 40 kept; `per_class: 1, size: 40`).
- MH: the first half of LH (the rank-1 classes when `per_class` = 2) plus random pool classes for the other half.
- HH: |LH| (or `hh_size`) random pool classes.
The pool is every class of every source not in LH (ImageNet-1k minus LH in the paper), or `pool` (entries "<source>"
stand for all of that source's classes). Random draws come from `numpy_rng(seed, purpose="guiding/<level>")`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from flsuite.data.base import DataError
from flsuite.seeding import numpy_rng

Level = Literal["LH", "MH", "HH"]


def load_mapping(path: str | Path) -> dict[str, list[str]]:
    """The FL class → ranked public classes mapping of a JSON file (FL classes in the file's order)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"guiding mapping file not found: {path}")
    spec = json.loads(path.read_text())
    mapping = spec.get("mapping")
    if not isinstance(mapping, dict) or not all(isinstance(v, list) and v for v in mapping.values()):
        raise DataError(f"{path}: expected {{'mapping': {{fl_class: [public classes, best first]}}}}")
    order = spec.get("fl_classes", list(mapping))
    missing = [c for c in order if c not in mapping]
    if missing:
        raise DataError(f"{path}: fl_classes {missing} have no entry in 'mapping'")
    return {c: [str(p) for p in mapping[c]] for c in order}


def related_classes(mapping: Mapping[str, Sequence[str]], per_class: int = 2) -> list[str]:
    """LH before `size`: ranks 1..per_class per FL class, rank by rank, duplicates falling through to the next rank."""
    taken: list[str] = []
    position = dict.fromkeys(mapping, 0)
    for _ in range(per_class):
        for fl_class, ranked in mapping.items():
            i = position[fl_class]
            while i < len(ranked) and ranked[i] in taken:
                i += 1
            if i == len(ranked):
                raise DataError(
                    f"guiding mapping: FL class {fl_class!r} has fewer than {per_class} distinct public classes "
                    "not taken by others"
                )
            taken.append(ranked[i])
            position[fl_class] = i + 1
    return taken


def chosen_for(mapping: Mapping[str, Sequence[str]], public: str) -> str | None:
    """The FL class a public class stands for: the one ranking it best (rank, then file order: the FL class LH's
    rank-by-rank selection takes it for); None when no FL class lists it (an unrelated class)."""
    ranks = [(ranked.index(public), i, fl) for i, (fl, ranked) in enumerate(mapping.items()) if public in ranked]
    return min(ranks)[2] if ranks else None


def select_classes(
    mapping: Mapping[str, Sequence[str]],
    level: Level,
    pool: Sequence[str],
    seed: int,
    per_class: int = 2,
    size: int | None = None,
    hh_size: int | None = None,
) -> list[str]:
    """The guiding classes of `level` by the A6 rule (module docstring), in label order."""
    if level not in ("LH", "MH", "HH"):
        raise DataError(f"guiding level must be 'LH', 'MH' or 'HH', got {level!r}")
    lh = related_classes(mapping, per_class)
    if size is not None:
        if not 0 < size <= len(lh):
            raise DataError(f"guiding size {size} must be in 1..{len(lh)} (the related classes found)")
        lh = [lh[i] for i in numpy_rng(seed, purpose="guiding/size").permutation(len(lh))[:size]]
    if level == "LH":
        return lh
    unrelated = [c for c in dict.fromkeys(pool) if c not in lh]
    rng = numpy_rng(seed, purpose=f"guiding/{level}")
    keep = lh[: len(lh) // 2] if level == "MH" else []
    need = len(lh) - len(keep) if level == "MH" or hh_size is None else hh_size
    if need > len(unrelated):
        raise DataError(
            f"guiding level {level}: needs {need} unrelated pool classes, the pool has {len(unrelated)} "
            "(set hh_size or a larger pool)"
        )
    return keep + [unrelated[i] for i in rng.choice(len(unrelated), need, replace=False)]
