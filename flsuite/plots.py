"""The run folder's plots: the partition heat-map (`partition.png`) and the accuracy per round (`convergence.png`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flsuite.records import ACC_MEAN, ACC_PREFIX, ROUND, evaluated

#: The partition heat-map labels every client up to this many, every k-th client beyond.
MAX_LABELLED_CLIENTS = 40


def plot_partition(stats: Mapping[str, Any], path: Path) -> None:
    """Heat-map of samples per client (rows) per class (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.array([c["per_class"] for c in stats["clients"]])
    rows = counts.shape[0]
    # a bounded figure and labels: one label per client took ~20 s of a 1,000-client run's start-up (docs/scale-out.md)
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * counts.shape[1] + 2), min(12, max(2.5, 0.3 * rows + 1.5))))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    shown = range(0, rows, -(-rows // MAX_LABELLED_CLIENTS))
    ax.set_yticks(
        list(shown), [f"{stats['clients'][i]['client']} ({stats['clients'][i]['domain']})" for i in shown], fontsize=7
    )
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_convergence(history: Sequence[Mapping[str, Any]], domains: Sequence[str], path: Path) -> None:
    """Accuracy per round: every domain and the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = evaluated(history)
    if not done:
        return
    rounds = [r[ROUND] for r in done]
    fig, ax = plt.subplots(figsize=(6, 4))
    if len(domains) > 1:
        for d in domains:
            ax.plot(rounds, [r[f"{ACC_PREFIX}{d}"] for r in done], lw=1, alpha=0.7, label=d)
    ax.plot(rounds, [r[ACC_MEAN] for r in done], lw=2, color="black", label="mean")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
