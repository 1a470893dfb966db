"""Metric definitions: the GGEUR paper's AVG/STD convention, last-k averages, exact accuracy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flsuite.data.base import Split
from flsuite.metrics import accuracy, domain_summary, domain_table, final_summary


def test_domain_summary_reproduces_the_ggeur_table_convention():
    # GGEUR Table 4, FedAvg (CLIP+MLP): MNIST, USPS, SVHN, SYN -> AVG 76.60, STD 16.25 (population std)
    s = domain_summary({"mnist": 95.12, "usps": 89.74, "svhn": 56.36, "syn": 65.17})
    assert round(s["acc_mean"], 2) == 76.60
    assert round(s["acc_std"], 2) == 16.25
    assert s["acc_std_sample"] == pytest.approx(s["acc_std"] * (4 / 3) ** 0.5)


def test_single_domain_has_no_sample_std():
    s = domain_summary({"all": 50.0})
    assert s["acc_std"] == 0.0 and "acc_std_sample" not in s


def test_accuracy_is_an_exact_ratio():
    model = nn.Identity()
    x = torch.eye(3).repeat(3, 1)[:7]  # predictions 0,1,2,0,1,2,0
    y = torch.tensor([0, 1, 2, 0, 1, 1, 1])
    assert accuracy(model, Split(x, y), num_classes=3, batch_size=2) == 100.0 * 5 / 7


def test_final_summary_last_k_best_and_target():
    history = [{"round": r, "acc/a": float(r), "acc/b": float(2 * r), "acc_mean": 1.5 * r, "acc_std": 0.5 * r} for r in range(1, 9)]
    history.append({"round": 9, "train_loss": 0.1})  # a round without evaluation is ignored
    s = final_summary(history, last_k=5, target_acc=6.0)
    assert s["last5/acc/a"] == pytest.approx((4 + 5 + 6 + 7 + 8) / 5)
    assert s["last5/acc_std"] == pytest.approx(0.5 * 6)
    assert s["last/acc_mean"] == 12.0 and s["best/round"] == 8
    assert s["rounds_to_target"] == 4
    table = domain_table(s, ["a", "b"])
    assert "| last-5 avg | 6.00 | 12.00 | 9.00 | 3.00 |" in table
