"""Trainable backbones (ResNet-10/18), the image path's augmentation, and the standard per-batch Lightning loop."""

from __future__ import annotations

import json
import urllib.error
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from flsuite.data.augment import Augment
from flsuite.data.base import ClientData, DataSource, EpochBatches, FederatedData, Split
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.local.batches import IndexBatches, client_batches
from flsuite.federation.local.loops import ClientFit
from flsuite.federation.method import ClientModule
from flsuite.federation.task import LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.scaffold import Scaffold
from flsuite.models import backbones
from flsuite.models.backbones import ResNet10, ResNet18
from flsuite.models.heads import MLP
from flsuite.seeding import torch_generator
from tests.helpers import head_federation

# ---- backbones --------------------------------------------------------------------------------------------------


def test_resnet10_is_four_single_block_stages_with_the_small_input_stem():
    model = ResNet10().build((3, 32, 32), 7)
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [1, 1, 1, 1]
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and isinstance(model.maxpool, nn.Identity)
    assert model.features(torch.randn(2, 3, 32, 32)).shape == (2, 512) and model.head.out_features == 7
    big = ResNet10(small_input=False).build((1, 64, 64), 3)
    assert big.conv1.kernel_size == (7, 7) and big.conv1.in_channels == 1 and isinstance(big.maxpool, nn.MaxPool2d)


def test_resnet18_keeps_torchvision_names_so_imagenet_checkpoints_map():
    model = ResNet18().build((3, 32, 32), 10)
    assert list(model.state_dict()) == list(torchvision.models.resnet18(num_classes=10).state_dict())


def test_normalisation_is_inside_the_model_and_outside_the_state_dict():
    mean, std = [0.1, 0.2, 0.3], [0.5, 0.25, 2.0]
    torch.manual_seed(0)
    plain = ResNet10().build((3, 8, 8), 3).eval()
    normed = ResNet10(mean=mean, std=std).build((3, 8, 8), 3).eval()
    assert list(normed.state_dict()) == list(plain.state_dict())
    normed.load_state_dict(plain.state_dict())
    x = torch.rand(2, 3, 8, 8)
    expected = plain((x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1))
    torch.testing.assert_close(normed(x), expected)


@pytest.mark.parametrize(
    "kwargs, shape, match",
    [
        (dict(mean=[0.5]), (3, 8, 8), "both mean and std"),
        (dict(mean=[0.5, 0.5], std=[1.0, 1.0]), (3, 8, 8), "1 or 3 values"),
        (dict(mean=[0.5], std=[0.0]), (3, 8, 8), "std must be > 0"),
        ({}, (64,), r"needs image inputs \[C, H, W\]"),
    ],
)
def test_bad_backbone_settings_fail_clearly(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        ResNet10(**kwargs).build(shape, 3)


@pytest.fixture
def fake_imagenet(monkeypatch):
    """torch.hub's loader replaced by an in-memory ImageNet-shaped ResNet-18 state dict (tests never download)."""
    torch.manual_seed(1)
    reference = torchvision.models.resnet18().state_dict()
    calls = []

    def load(url, **kwargs):
        calls.append(url)
        return reference

    monkeypatch.setattr(backbones, "_STATE_DICTS", {})
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", load)
    return reference, calls


def test_pretrained_resnet18_takes_every_imagenet_weight_but_the_classifier(fake_imagenet):
    reference, calls = fake_imagenet
    model = ResNet18(pretrained=True).build((3, 32, 32), 10)
    own = model.state_dict()
    assert calls == [torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url]
    assert all(torch.equal(own[k], reference[k]) for k in reference if not k.startswith("fc."))
    assert own["fc.weight"].shape == (10, 512)
    grey = ResNet18(pretrained=True).build((1, 32, 32), 10)
    torch.testing.assert_close(grey.conv1.weight, reference["conv1.weight"].sum(1, keepdim=True))
    small = ResNet18(pretrained=True, small_input=True).build((3, 32, 32), 10)
    assert small.conv1.weight.shape == (64, 3, 3, 3) and torch.equal(
        small.layer4[1].conv2.weight, reference["layer4.1.conv2.weight"]
    )
    assert len(calls) == 1  # read once per process, not once per client build


def test_pretrained_weights_offline_give_a_clear_error(monkeypatch):
    def offline(url, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(backbones, "_STATE_DICTS", {})
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(
        RuntimeError, match=r"cannot load the ImageNet weights .*resnet18.*not in torch.hub's cache .*pretrained: false"
    ):
        ResNet18(pretrained=True).build((3, 32, 32), 10)


# ---- augmentation -----------------------------------------------------------------------------------------------


def test_augmentation_is_a_per_sample_padded_crop_and_flip_from_the_stream():
    x = torch.arange(6 * 2 * 5 * 5, dtype=torch.float32).view(6, 2, 5, 5)
    out = Augment(crop_padding=2, hflip=True)(x, torch_generator(3, purpose="augment"))
    g = torch_generator(3, purpose="augment")
    flips = torch.rand(6, generator=g) < 0.5
    offsets = torch.randint(0, 5, (6, 2), generator=g)
    for i in range(6):
        img = x[i].flip(-1) if flips[i] else x[i]
        dy, dx = offsets[i].tolist()
        torch.testing.assert_close(out[i], F.pad(img, (2, 2, 2, 2))[:, dy : dy + 5, dx : dx + 5], rtol=0, atol=0)
    assert Augment()(x, torch_generator(3)) is x  # off: untouched


def test_augmentation_is_deterministic_per_seed_and_differs_across_seeds():
    x = torch.rand(16, 3, 8, 8)
    aug = Augment(crop_padding=4, hflip=True)
    a = aug(x, torch_generator(1, purpose="augment"))
    assert torch.equal(a, aug(x, torch_generator(1, purpose="augment")))
    assert not torch.equal(a, aug(x, torch_generator(2, purpose="augment")))


def image_split(n: int = 20) -> Split:
    return Split(torch.rand(n, 1, 6, 6), torch.arange(n) % 3)


@pytest.mark.parametrize("loop", ["lean", "standard"])
def test_client_batches_are_reproducible_from_the_task_seed(loop):
    local = LocalTraining(batch_size=8, epochs=2, loop=loop, augment=Augment(crop_padding=2, hflip=True))

    split = image_split()

    def draw(seed):
        data, epochs = client_batches(split, local, seed)
        if loop == "lean":  # each iteration (one per epoch, as Lightning does) yields that epoch's batches as one item
            return [b for _ in range(epochs) for epoch in data for b in epoch]
        return [b for _ in range(epochs) for b in data]

    first = draw(11)
    assert [len(y) for _, y in first] == [8, 8, 4] * 2
    again = draw(11)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    other = draw(12)
    assert not any(torch.equal(a[0], b[0]) for a, b in zip(first, other))


def test_the_standard_loop_sees_the_lean_loops_batches():
    split = image_split(21)
    for kwargs in (dict(epochs=2), dict(steps=7), dict(epochs=1, drop_last=True)):
        local = dict(batch_size=4, augment=Augment(crop_padding=1, hflip=True), **kwargs)
        lean, lean_epochs = client_batches(split, LocalTraining(loop="lean", **local), 5)
        std, std_epochs = client_batches(split, LocalTraining(loop="standard", **local), 5)
        lean_batches = [b for _ in range(lean_epochs) for epoch in lean for b in epoch]
        std_batches = [b for _ in range(std_epochs) for b in std]
        assert lean_epochs == std_epochs and len(lean_batches) == len(std_batches) == len(std) * std_epochs
        for (xa, ya), (xb, yb) in zip(lean_batches, std_batches):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_index_batches_follow_epoch_batches():
    split = Split(torch.arange(10).float()[:, None], torch.zeros(10, dtype=torch.long))
    sampler = IndexBatches(10, 4, torch_generator(0, purpose="batches"), epochs=1, steps=None, drop_last=False)
    reference = EpochBatches(split, 4, torch_generator(0, purpose="batches"))
    for _ in range(2):
        assert [i.tolist() for i in sampler] == [x[:, 0].long().tolist() for x, _ in reference.epoch()]


# ---- the standard Lightning loop ---------------------------------------------------------------------------------


def gaussian() -> GaussianFeatures:
    return GaussianFeatures(
        dim=6, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=40, test_per_domain=30
    )


@pytest.mark.parametrize("method", [None, Scaffold()], ids=["fedavg", "scaffold"])
def test_standard_loop_gives_the_lean_loops_weights(tmp_path, monkeypatch, method):
    """Same batches, same ops in the same order (zero_grad → loss → backward → hook → SGD step) → bit-identical
    weights, losses and SCAFFOLD control variates (whose gradient correction runs in `before_optimizer_step`)."""
    extra = {} if method is None else {"method": method}
    standard_steps = []
    step = ClientFit.standard_step
    monkeypatch.setattr(ClientFit, "standard_step", lambda self, *a: standard_steps.append(1) or step(self, *a))
    runs = {}
    for loop in ("lean", "standard"):
        local = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0.0, loop=loop)
        head_federation(tmp_path / loop, data=gaussian(), model=MLP(hidden=(5,)), rounds=2, local=local, **extra).fit()
        runs[loop] = load_checkpoint(tmp_path / loop)
    assert len(standard_steps) == 2 * 2 * 2 * 5  # only the standard run: rounds × clients × epochs × ⌈40/8⌉ batches
    lean, std = runs["lean"], runs["standard"]
    for k in lean.global_weights:
        assert torch.equal(lean.global_weights[k], std.global_weights[k]), k
    assert [r["train_loss"] for r in lean.history] == [r["train_loss"] for r in std.history]
    if method is not None:
        assert any(v.abs().sum() > 0 for v in std.server_state["c"].values())
        for k, v in lean.server_state["c"].items():
            assert torch.equal(v, std.server_state["c"][k]), k


def test_precision_other_than_32_needs_the_standard_loop():
    with pytest.raises(ValueError, match="local.precision '16-mixed' needs local.loop: standard"):
        LocalTraining(precision="16-mixed", loop="lean")
    LocalTraining(precision="16-mixed")  # the default `auto` takes the standard loop (flsuite.federation.local.choice)
    with pytest.raises(ValueError, match="local.precision must be"):
        LocalTraining(precision="16", loop="standard")
    with pytest.raises(ValueError, match="local.loop must be"):
        LocalTraining(loop="fast")


class HookProbe(ClientModule):
    """Records the method hooks in call order; `before` notes whether the gradients exist yet."""

    events: ClassVar[list[str]] = []
    step_hooks = True

    def local_loss(self, x, y):
        HookProbe.events.append("loss")
        return super().local_loss(x, y)

    def before_optimizer_step(self):
        HookProbe.events.append(
            "before" if all(p.grad is not None for p in self.model.parameters()) else "before-no-grad"
        )

    def after_optimizer_step(self):
        HookProbe.events.append("after")


class HookFedAvg(FedAvg):
    client_module = HookProbe


@pytest.mark.parametrize("loop", ["lean", "standard"])
def test_both_loops_call_the_method_hooks_once_per_batch_in_order(tmp_path, loop):
    HookProbe.events = []
    local = LocalTraining(steps=3, batch_size=8, lr=0.1, loop=loop)
    head_federation(tmp_path, data=gaussian(), model=MLP(hidden=(5,)), rounds=1, local=local, method=HookFedAvg()).fit()
    assert HookProbe.events == ["loss", "before", "after"] * 3 * 2  # steps × clients


class AutocastProbe(ClientModule):
    """Records, per local step, whether the loss ran under CPU autocast and in which dtype."""

    seen: ClassVar[list[tuple[bool, torch.dtype]]] = []

    def local_loss(self, x, y):
        AutocastProbe.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return super().local_loss(x, y)


class AutocastFedAvg(FedAvg):
    client_module = AutocastProbe


@pytest.mark.parametrize("precision, autocast", [("32-true", False), ("bf16-mixed", True)])
def test_local_precision_reaches_the_standard_loops_trainer(tmp_path, precision, autocast):
    AutocastProbe.seen = []
    local = LocalTraining(steps=2, batch_size=8, lr=0.1, loop="standard", precision=precision)
    head_federation(
        tmp_path, data=gaussian(), model=MLP(hidden=(5,)), rounds=1, local=local, method=AutocastFedAvg()
    ).fit()
    assert len(AutocastProbe.seen) == 2 * 2  # clients × steps
    assert all(enabled == autocast for enabled, _ in AutocastProbe.seen)
    if autocast:
        assert all(dtype == torch.bfloat16 for _, dtype in AutocastProbe.seen)
    assert all(torch.isfinite(v).all() for v in load_checkpoint(tmp_path).global_weights.values())


class TinyImages(DataSource):
    """2 domains × 1 client of 16×16 RGB images whose class sets the mean colour (learnable, no download)."""

    def build(self, seed: int) -> FederatedData:
        g = torch.Generator().manual_seed(seed)

        def split(n: int, shift: float) -> Split:
            y = torch.arange(n) % 3
            colours = torch.eye(3)[y][:, :, None, None]
            return Split(colours + shift + 0.3 * torch.randn(n, 3, 16, 16, generator=g), y)

        clients = [ClientData(0, "a", split(24, 0.0)), ClientData(1, "b", split(24, 0.5))]
        return FederatedData(clients, {"a": split(12, 0.0), "b": split(12, 0.5)}, num_classes=3)


def test_resnet10_trains_end_to_end_on_images_through_the_standard_loop(tmp_path):
    local = LocalTraining(steps=3, batch_size=8, lr=0.05, loop="standard", augment=Augment(crop_padding=2, hflip=True))
    model = ResNet10(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    for run in ("a", "b"):
        head_federation(tmp_path / run, data=TinyImages(), model=model, rounds=2, local=local).fit()
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all(r["clients"] == [0, 1] for r in rows)
    assert all(r["train_loss"] > 0 and r["train_loss"] == r["train_loss"] for r in rows)
    weights = load_checkpoint(tmp_path / "a").global_weights
    torch.manual_seed(0)
    assert set(weights) == set(model.build((3, 16, 16), 3).state_dict())
    assert all(torch.isfinite(v.float()).all() for v in weights.values())
    assert int(weights["bn1.num_batches_tracked"]) == 2 * 3  # 2 rounds × 3 steps: one training_step per batch
    # seeded batch order and augmentation: a second run gives the same numbers
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()
