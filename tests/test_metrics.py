"""Metric definitions: the GGEUR paper's AVG/STD convention, last-k averages, exact accuracy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flsuite.data.base import Split
from flsuite.metrics import accuracy, domain_summary, domain_table, final_summary
from flsuite.records import summary_prefix


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


def test_accuracy_counts_what_torchmetrics_micro_accuracy_counts():
    from torchmetrics.classification import MulticlassAccuracy

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 5, generator=gen), torch.randint(5, (1000,), generator=gen)
    metric = MulticlassAccuracy(num_classes=5, average="micro")
    metric.update(x.argmax(1), y)
    correct = int(metric.tp.sum())  # type: ignore[union-attr]
    assert 300 > correct > 100  # ~1/5 right: a test of counting, not of a constant
    assert accuracy(nn.Identity(), Split(x, y), num_classes=5, batch_size=64) == 100.0 * correct / 1000


@pytest.mark.parametrize(
    ("logits", "labels", "message"),
    [
        (torch.eye(4)[1:], torch.tensor([1, 2, 0]), "a predicted class is 3, outside 0..2"),  # a 4-way model
        (torch.eye(3), torch.tensor([0, 1, 3]), "a label is 3, outside 0..2"),
        (torch.eye(3), torch.tensor([0, -1, 2]), "a label is -1, outside 0..2"),
    ],
)
def test_accuracy_names_a_class_outside_the_datas_count(logits, labels, message):
    with pytest.raises(ValueError, match=message):
        accuracy(nn.Identity(), Split(logits, labels), num_classes=3)


def test_final_summary_last_k_best_and_target():
    history = [
        {"round": r, "acc/a": float(r), "acc/b": float(2 * r), "acc_mean": 1.5 * r, "acc_std": 0.5 * r}
        for r in range(1, 9)
    ]
    history.append({"round": 9, "train_loss": 0.1})  # a round without evaluation is ignored
    s = final_summary(history, last_k=5, target_acc=6.0)
    assert s["last5/acc/a"] == pytest.approx((4 + 5 + 6 + 7 + 8) / 5)
    assert s["last5/mean_of_round_acc_std"] == pytest.approx(0.5 * 6)  # the old arithmetic, under its own name
    assert s["last5/acc_std"] == pytest.approx(3.0)  # |12 - 6| / 2: population std of the two last-5 means
    assert s["last5/rounds"] == 5
    assert s["last/acc_mean"] == 12.0 and s["best/round"] == 8
    assert s["rounds_to_target"] == 4
    assert summary_prefix(s) == "last5/"
    table = domain_table(s, ["a", "b"])
    assert "| last-5 avg | 6.00 | 12.00 | 9.00 | 3.00 | 4.24 |" in table  # sample std = 6 / sqrt(2)


def test_final_std_is_the_std_across_domains_of_the_last_k_means():
    # Two domains whose per-round accuracies swap: every round's std is 10, but the last-2 means are equal.
    rounds = [(1, 50.0, 70.0), (2, 70.0, 50.0), (3, 50.0, 70.0)]
    history = [{"round": r, **domain_summary({"x": a, "y": b})} for r, a, b in rounds]
    s = final_summary(history, last_k=2)
    assert s["last2/acc/x"] == 60.0 and s["last2/acc/y"] == 60.0
    assert s["last2/acc_std"] == 0.0 and s["last2/acc_std_sample"] == 0.0  # papers' arithmetic
    assert s["last2/mean_of_round_acc_std"] == 10.0  # mean of per-round population stds
    assert s["last2/mean_of_round_acc_std_sample"] == pytest.approx(10.0 * 2**0.5)
    assert "last5/acc_mean" not in s and summary_prefix(s) == "last2/"
    # three domains, last-3 means 80, 70, 60 -> population std sqrt(200/3), sample std 10
    history = [
        {"round": r, **domain_summary({"p": 80.0 + d, "q": 70.0 - d, "r": 60.0})}
        for r, d in ((1, 1.0), (2, 0.0), (3, -1.0))
    ]
    s = final_summary(history, last_k=3)
    assert s["last3/acc_std"] == pytest.approx((200 / 3) ** 0.5)
    assert s["last3/acc_std_sample"] == pytest.approx(10.0)


def test_short_run_says_how_many_rounds_it_averages():
    history = [{"round": r, **domain_summary({"a": 10.0 * r, "b": 20.0 * r})} for r in (1, 2)]
    s = final_summary(history, last_k=5)
    assert s["last5/rounds"] == 2 and s["last5/acc/a"] == 15.0 and s["last5/acc_std"] == 7.5
    table = domain_table(s, ["a", "b"], last_k=5)
    assert "| last-2 avg (run shorter than last_k=5) | 15.00 | 30.00 | 22.50 | 7.50 |" in table
    assert "| last round | 20.00 | 40.00 | 30.00 | 10.00 |" in table


def test_single_domain_final_numbers_have_no_sample_std():
    history = [{"round": r, **domain_summary({"all": 40.0 + r})} for r in (1, 2, 3)]
    s = final_summary(history, last_k=2)
    assert s["last2/acc_mean"] == 42.5 and s["last2/acc_std"] == 0.0 and "last2/acc_std_sample" not in s
    assert "STD (n-1)" not in domain_table(s, ["all"], last_k=2)
