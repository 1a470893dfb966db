"""What each FedCiR loss term weighs in training (issue 24): from the runs of experiments/fedcir_tuned.sh and
fedcir_table2.sh, per variant (mean over seeds) the client/fedcir/* metrics that the clients log each round
(flsuite.methods.fedcir_terms): the unweighted terms (ce, reg in nats, align in nats), each weighted term's share of the
loss (lambda*L_t / L) and its gradient norm against the cross-entropy's (||grad lambda*L_t|| / ||grad CE||, at the
fit's starting weights), each as a mean over a window of rounds (2-10, 11-25, 26-40, 41-50 and all of 2..T: round 1
runs without the terms), then over seeds with the seeds' spread: a diagnostic is never read from one round's probe
(issue 38: seed 1's round-50 gradient share was 0.38 against 0.05-0.07 on the other seeds, and 6-8 % over 41-50).

    python experiments/fedcir_shares.py [--runs runs/fedcir_pacs_tuned] [--out docs/results/fedcir_shares_pacs.md]
        [--windows 2-10 11-25 26-40 41-50]
        [--paired VARIANT OTHER...]   # also: VARIANT's test AVG minus each OTHER's, seed by seed (paired, with SE
                                      # and 95 % interval: flsuite.compare.paired_difference)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from flsuite import compare
from flsuite.provenance import runs_code_mix
from flsuite.records import ACC_MEAN
from flsuite.seeding import label_key

PREFIX = "client/fedcir/"
COLUMNS = ["ce", "reg", "align", "reg_loss_share", "align_loss_share", "reg_grad_vs_ce", "align_grad_vs_ce"]
PERCENT = {"reg_loss_share", "align_loss_share", "reg_grad_vs_ce", "align_grad_vs_ce"}


def cell(values: list[float], key: str) -> str:
    """Mean over seeds ± their sample SD (one seed: the mean alone)."""
    if not values:
        return "–"
    scale, fmt = (100.0, ".2f") if key in PERCENT else (1.0, ".3g")
    mean = scale * float(np.mean(values))
    sd = f" ± {scale * float(np.std(values, ddof=1)):{fmt}}" if len(values) > 1 else ""
    return f"{mean:{fmt}}{sd}" + (" %" if key in PERCENT else "")


def window(text: str) -> tuple[int, int]:
    """'A-B' -> (A, B), rounds A..B inclusive."""
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
        raise argparse.ArgumentTypeError(f"a window is FIRST-LAST rounds, e.g. 41-50, got {text!r}")
    return int(first), int(last)


def paired(runs: Path, variant: str, others: list[str], read: list[Path]) -> list[str]:
    """Per seed both ran: `variant`'s last-k test AVG minus each other's (the paired difference the seeds share:
    same partitions, same initial weights); the run folders it reads are added to `read`."""

    def avg(name: str) -> dict[tuple[int, str], float]:
        done = [compare.load_run(s) for s in sorted((runs / name).glob("seed*")) if (s / "summary.json").is_file()]
        read.extend(r.path for r in done)
        return {label_key(r.path.name): float(r.summary[r.prefix + ACC_MEAN]) for r in done}

    mine = avg(variant)
    lines = [
        f"Paired differences of the test AVG, `{variant}` minus each (per seed; mean, SE, 95 % interval):",
        "",
        "| other | per seed | mean | SE | 95 % interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for other in others:
        d = compare.paired_difference(mine, avg(other))
        shown = ", ".join(f"{v:+.2f}" for v in d.diffs) or "–"
        lines.append(f"| {other} | {shown} | " + " | ".join(d.cells()) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("runs/fedcir_pacs_tuned"))
    ap.add_argument("--windows", type=window, nargs="+", default=[(2, 10), (11, 25), (26, 40), (41, 50)])
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--paired",
        nargs="+",
        metavar="VARIANT",
        help="run folders: the first's last-k test AVG minus each other's, per seed",
    )
    args = ap.parse_args()
    lines = [
        "# FedCiR's loss terms on PACS (CPU setting, 50 rounds): size, share of the loss, share of the gradient",
        "",
        (
            "Regenerate: `python experiments/fedcir_shares.py` "
            "(after `bash experiments/fedcir_tuned.sh` and `bash experiments/fedcir_table2.sh`)."
        ),
        (
            "Each cell: the clients' sample-weighted mean in each round (`client/fedcir/*`), its mean over the "
            "window's rounds per seed, then the mean ± sample SD over seeds; `all` = rounds 2..T "
            "(round 1 runs without the terms)."
        ),
        (
            "Loss share = λ·L_t / L (mean over the fit's steps); "
            "gradient vs CE = ‖∇ λ·L_t‖ / ‖∇ CE‖ over the encoder and head,"
        ),
        (
            "measured once per fit on its first batch at the round's starting weights. "
            "A term that is off has no column value (–)."
        ),
        "",
        "| variant | rounds | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    read: list[Path] = []  # every run folder the tables read: they should come from one code version
    for variant in sorted(p for p in args.runs.iterdir() if p.is_dir() and p.name.startswith("fedcir")):
        folders = [s for s in sorted(variant.glob("seed*")) if (s / "summary.json").is_file()]
        read += folders
        runs = [compare.load_run(s).history for s in folders]
        if not runs:
            continue
        for first, last in [*args.windows, (2, None)]:
            row = []
            for key in COLUMNS:
                per_seed = []
                for h in runs:
                    vals = [
                        r[PREFIX + key]
                        for r in h
                        if PREFIX + key in r and first <= r["round"] and (last is None or r["round"] <= last)
                    ]
                    if vals:
                        per_seed.append(float(np.mean(vals)))
                row.append(cell(per_seed, key))
            rounds = "all" if last is None else f"{first}–{last}"
            lines.append(f"| {variant.name} ({len(runs)} seeds) | {rounds} | " + " | ".join(row) + " |")
    if args.paired:
        lines += ["", *paired(args.runs, args.paired[0], args.paired[1:], read)]
    if warning := runs_code_mix(read):
        print(warning, file=sys.stderr)
        lines += ["", f"**{warning}**"]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
