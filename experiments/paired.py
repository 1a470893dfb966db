"""Seed-paired differences of a study's runs: for each pair "A - B" of variant folders under one study's run folder,
A's last-k AVG (or a domain's accuracy) minus B's on every seed both finished; their mean, its standard error, the 95 %
interval (Student's t over the pairs) and whether it is resolved (the interval excludes 0); as a Markdown table.

    python experiments/paired.py runs/fkpl_pacs_official "fkpl - fkpl-federated-head" "fkpl - fedavg" \
        [--metric acc_mean] [--out docs/results/fkpl_pacs_official_paired.md] [--command "..."]

The variant folders are study.py's slugs of the variant labels (`ls runs/<study>`). Runs are read with
`flsuite.compare.load_run` (the summary's last-k prefix, as every study table); the statistics are
`flsuite.compare.paired_difference`'s, the ones `flsuite compare` shows: SE = sample std of the differences / √pairs,
95 % interval = mean ± t(0.975, pairs − 1) · SE; one pair has no interval and is not resolved. When the table's runs
come from more than one code version (environment.json `code`: commit and uncommitted changes), a warning under the
table names each and how many runs it made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flsuite import compare
from flsuite.provenance import code_mix, recorded_code
from flsuite.records import ACC_PREFIX


def seed_values(variant: Path, metric: str) -> dict[str, float]:
    """{seed folder name: the metric} over the variant's finished runs."""
    values = {}
    for seed in sorted(variant.glob("seed*")):
        if not (seed / "summary.json").is_file():
            continue
        run = compare.load_run(seed)
        key = run.prefix + (metric if metric == "acc_mean" else ACC_PREFIX + metric)
        if key not in run.summary:
            raise KeyError(f"{seed}/summary.json has no {key!r} (domains: {', '.join(run.domains)})")
        values[seed.name] = float(run.summary[key])
    return values


def paired_row(runs: Path, pair: str, metric: str, codes: dict | None = None) -> str:
    """The pair's table row; the code version of each run it reads goes into `codes` (run folder -> code; when
    given)."""
    left, sep, right = (part.strip() for part in pair.partition(" - "))
    if not sep or not left or not right:
        raise SystemExit(f"paired.py: a pair is 'A - B' (two variant folders of {runs}), got {pair!r}")
    missing = [name for name in (left, right) if not (runs / name).is_dir()]
    if missing:
        known = (
            ", ".join(sorted(p.name for p in runs.iterdir() if p.is_dir() and any(p.glob("seed*"))))
            if runs.is_dir()
            else "none"
        )
        raise SystemExit(f"paired.py: no variant folder {', '.join(missing)} under {runs} (variants there: {known})")
    a, b = (seed_values(runs / name, metric) for name in (left, right))
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        raise SystemExit(f"paired.py: {left} and {right} have no finished seed in common under {runs}")
    if codes is not None:
        codes |= {runs / name / s: recorded_code(runs / name / s) for name in (left, right) for s in seeds}
    d = compare.paired_difference({s: a[s] for s in seeds}, b)
    mean, se, interval, verdict = d.cells()
    per_seed = ", ".join(f"{v:+.2f}" for v in d.diffs)
    wins = sum(v > 0 for v in d.diffs)
    return f"| {left} − {right} | {mean} | {se} | {interval} | {per_seed} | {wins} of {d.n} | {verdict} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="a study's run folder (runs/<name>)")
    ap.add_argument("pairs", nargs="+", help='"A - B": two variant folders')
    ap.add_argument("--metric", default="acc_mean", help="acc_mean (AVG) or a domain's name")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--command", help="the regenerating command printed under the table")
    args = ap.parse_args()
    lines = [
        f"| pair ({args.metric}, last-k) | mean | SE | 95 % interval | per seed | A above B | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    codes: dict = {}
    lines += [paired_row(args.runs, pair, args.metric, codes) for pair in args.pairs]
    if warning := code_mix(list(codes.values())):
        lines += ["", f"**{warning}**"]
    text = "\n".join(lines) + "\n"
    if args.command:
        text += f"\nRegenerate: `{args.command}`\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
