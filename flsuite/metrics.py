"""Metrics, one definition used everywhere: runs, `flsuite compare`, studies and dashboards read these keys.

- Per-domain top-1 accuracy (%) of the global model on each domain's test set: correct predictions counted in
  integers, one exact ratio (torchmetrics' micro `MulticlassAccuracy` counts the same, but importing it costs every
  run process seconds, for a comparison and a sum: docs/performance.md, "A run's imports").
- `acc_mean`: unweighted mean over domains; `acc_std`: population standard deviation over domains (GGEUR's
  convention, ddof=0); `acc_std_sample`: sample standard deviation (FKPL's convention, ddof=1; only with ≥ 2 domains).
- Final numbers: average over the last `last_k` evaluated rounds (GGEUR's protocol, k=5), best, and last; the final
  STD is the standard deviation across domains of the last-k mean accuracies (the papers' tables).
- Validation (`validation.fraction` > 0): the same `evaluate` on the per-domain validation split, under `val/`, in the
  same rounds; the summary gets their last-k means (`last{k}/val/...`), what a study selects hyperparameters on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import SupportsFloat, cast

import numpy as np
import torch
from torch import nn

from flsuite.data.base import FederatedData, Split
from flsuite.records import (
    ACC_MEAN,
    ACC_PREFIX,
    ACC_STD,
    ACC_STD_SAMPLE,
    BEST_ACC_MEAN,
    BEST_ROUND,
    LAST_PREFIX,
    ROUND,
    ROUNDS_TO_TARGET,
    TARGET_ACC,
    VAL_PREFIX,
    evaluated,
    is_accuracy_key,
    last_k_prefix,
)

__all__ = ["accuracy", "domain_summary", "domain_table", "evaluate", "evaluate_federation", "final_summary"]


@torch.inference_mode()
def accuracy(model: nn.Module, split: Split, num_classes: int, batch_size: int = 1024, device: str = "cpu") -> float:
    """Top-1 accuracy (%) of `model` on `split`: 100 · #{argmax f(x) = y} / n, counted in integers (exact)."""
    correct = 0
    was_training = model.training
    model.to(device)  # eval_device: the global model is kept on the CPU between rounds
    model.eval()
    for i in range(0, len(split), batch_size):
        x, y = split.x[i : i + batch_size].to(device), split.y[i : i + batch_size].to(device)
        predicted = model(x).argmax(dim=1)
        _check_classes(predicted, y, num_classes)
        correct += int((predicted == y).sum())
    model.train(was_training)
    return 100.0 * correct / len(split)


def _check_classes(predicted: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
    """Predicted classes and labels must lie in [0, num_classes): a model or a split of another class count."""
    for what, values in (("predicted class", predicted), ("label", y)):
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= num_classes:
            raise ValueError(
                f"accuracy: a {what} is {high if high >= num_classes else low}, outside 0..{num_classes - 1} "
                f"(the data's num_classes); the model's output width or the split's labels do not match the data"
            )


def domain_summary(per_domain: Mapping[str, float]) -> dict[str, float]:
    """acc/<domain> for each domain, plus acc_mean, acc_std (population) and acc_std_sample (≥ 2 domains)."""
    values = np.array(list(per_domain.values()), dtype=np.float64)
    out = {f"{ACC_PREFIX}{d}": float(v) for d, v in per_domain.items()}
    out[ACC_MEAN] = float(values.mean())
    out[ACC_STD] = float(values.std(ddof=0))
    if len(values) > 1:
        out[ACC_STD_SAMPLE] = float(values.std(ddof=1))
    return out


def evaluate(model: nn.Module, test: Mapping[str, Split], num_classes: int, device: str = "cpu") -> dict[str, float]:
    """Per-domain accuracy of the global model and the cross-domain summary."""
    return domain_summary({d: accuracy(model, s, num_classes, device=device) for d, s in test.items()})


def evaluate_federation(model: nn.Module, data: FederatedData, device: str = "cpu") -> dict[str, float]:
    """`evaluate` on the test splits and, when the run holds validation data out, on those under `val/`."""
    out = evaluate(model, data.test, data.num_classes, device=device)
    if data.validation:
        out.update(
            {
                f"{VAL_PREFIX}{k}": v
                for k, v in evaluate(model, data.validation, data.num_classes, device=device).items()
            }
        )
    return out


def final_summary(
    history: Sequence[Mapping[str, object]], last_k: int = 5, target_acc: float | None = None
) -> dict[str, object]:
    """Final numbers from the per-round records that carry accuracy.

    `last{k}/<metric>`: each per-domain accuracy and acc_mean averaged over the last k evaluated rounds (fewer when
    the run has fewer; `last{k}/rounds` says how many). The final STDs follow the papers' tables: the standard
    deviation across domains of the last-k mean accuracies, population (`last{k}/acc_std`, GGEUR) and sample
    (`last{k}/acc_std_sample`, FKPL; ≥ 2 domains). The mean of the per-round STDs (this suite's earlier final STD)
    is kept as `last{k}/mean_of_round_acc_std` (and `_sample`). Also `last/<metric>` (last evaluated round),
    `best/acc_mean` and its round, and `rounds_to_target` (first round whose acc_mean reaches `target_acc`, or None).
    With validation metrics in the records: `last{k}/val/<metric>` (their last-k means and STDs, computed the same
    way) and `last/val/<metric>`; no best round (that is a choice on the test set only).
    """
    done = evaluated(history)
    if not done:
        return {}
    prefix = last_k_prefix(last_k)
    keys = [k for k in done[-1] if is_accuracy_key(k)]
    tail = done[-last_k:]
    out = _last_k_means(tail, prefix, keys)
    for k in (ACC_STD, ACC_STD_SAMPLE):
        if k in keys:
            out[f"{prefix}mean_of_round_{k}"] = float(np.mean([float(r[k]) for r in tail]))
    out[f"{prefix}rounds"] = len(tail)
    out.update({f"{LAST_PREFIX}{k}": float(done[-1][k]) for k in keys})
    best = max(done, key=lambda r: float(r[ACC_MEAN]))
    out[BEST_ACC_MEAN] = float(best[ACC_MEAN])
    out[BEST_ROUND] = int(best[ROUND])
    if target_acc is not None:
        reached = [int(r[ROUND]) for r in done if float(r[ACC_MEAN]) >= target_acc]
        out[ROUNDS_TO_TARGET] = reached[0] if reached else None
        out[TARGET_ACC] = target_acc
    val_keys = [k for k in done[-1] if k.startswith(VAL_PREFIX) and is_accuracy_key(k.removeprefix(VAL_PREFIX))]
    if val_keys:
        out.update(_last_k_means(tail, prefix + VAL_PREFIX, val_keys, VAL_PREFIX))
        out.update({f"{LAST_PREFIX}{k}": float(done[-1][k]) for k in val_keys})
    return out


def _last_k_means(
    tail: Sequence[Mapping[str, object]], prefix: str, keys: Sequence[str], strip: str = ""
) -> dict[str, object]:
    """`<prefix><key>`: the last-k mean of each per-domain accuracy and of acc_mean (`keys` less `strip`), and the
    STDs across domains of the per-domain means."""
    means = {k.removeprefix(strip): float(np.mean([float(r[k]) for r in tail])) for k in keys}  # type: ignore[arg-type]
    out: dict[str, object] = {f"{prefix}{k}": v for k, v in means.items() if k not in (ACC_STD, ACC_STD_SAMPLE)}
    domain_means = np.array([v for k, v in means.items() if k.startswith(ACC_PREFIX)], dtype=np.float64)
    out[f"{prefix}{ACC_STD}"] = float(domain_means.std(ddof=0))
    if len(domain_means) > 1:
        out[f"{prefix}{ACC_STD_SAMPLE}"] = float(domain_means.std(ddof=1))
    return out


def _number(value: object) -> float:
    """A summary value (a JSON number, or a numeric string) as a float."""
    return float(cast("SupportsFloat | str", value))


def domain_table(summary: Mapping[str, object], domains: Sequence[str], last_k: int = 5) -> str:
    """A Markdown table: one row per statistic (last-k average, last round) and a column per domain.

    AVG is the mean over domains; STD the population standard deviation across domains (GGEUR), STD (n-1) the
    sample one (FKPL; with ≥ 2 domains). The first row's label says how many rounds it averages when the run had
    fewer evaluated rounds than `last_k`.
    """
    prefix = last_k_prefix(last_k)
    sample = f"{prefix}acc_std_sample" in summary
    header = "| | " + " | ".join(domains) + " | AVG | STD |" + (" STD (n-1) |" if sample else "")
    rule = "|---" * (len(domains) + 3 + sample) + "|"
    rows = [header, rule]
    averaged = int(_number(summary.get(f"{prefix}rounds", last_k)))
    first = f"last-{last_k} avg" if averaged >= last_k else f"last-{averaged} avg (run shorter than last_k={last_k})"
    for label, row in ((first, prefix), ("last round", "last/")):
        cells = [f"{_number(summary[f'{row}{ACC_PREFIX}{d}']):.2f}" for d in domains]
        cells += [f"{_number(summary[f'{row}acc_mean']):.2f}", f"{_number(summary[f'{row}acc_std']):.2f}"]
        if sample:
            value = summary.get(f"{row}acc_std_sample")
            cells.append("—" if value is None else f"{_number(value):.2f}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
