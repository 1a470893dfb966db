"""The model contract: `features(x)`, a linear `head`, model(x) == head(features(x)); state-dict keys of the
pre-contract models kept; representation-based methods ask the contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.methods.fedproto import FedProto
from flsuite.methods.moon import MOON
from flsuite.models.backbones import ResNet10, ResNet18
from flsuite.models.heads import MLP, Linear, ModelSpec, SmallCNN
from flsuite.models.representation import check_contract, forward_with_representation, logits_as_representation
from tests.helpers import head_federation

SPECS = [
    pytest.param(Linear(), (5,), 3, 5, id="linear"),
    pytest.param(MLP(hidden=(7, 4), dropout=0.1), (2, 3), 3, 4, id="mlp"),
    pytest.param(SmallCNN(channels=(4, 8), hidden=16), (1, 8, 8), 10, 16, id="smallcnn"),
    pytest.param(ResNet10(), (3, 16, 16), 4, 512, id="resnet10"),
    pytest.param(ResNet18(small_input=True, mean=[0.5], std=[0.25]), (1, 16, 16), 5, 512, id="resnet18"),
]


@pytest.mark.parametrize("spec, shape, classes, dim", SPECS)
def test_every_model_splits_into_features_and_a_linear_head(spec, shape, classes, dim):
    torch.manual_seed(0)
    model = check_contract(spec.build(shape, classes)).eval()
    x = torch.randn(3, *shape)
    z = model.features(x)
    assert isinstance(model.head, nn.Linear) and z.shape == (3, dim) and model.head.in_features == dim
    assert torch.equal(model(x), model.head(z))
    logits, rep = forward_with_representation(model, x, use_logits=False)
    assert torch.equal(rep, z) and torch.equal(logits, model(x))


# The state-dict keys of the plain nn.Sequential models before the contract (commit fc7ce5f), in order.
OLD_KEYS = {
    "linear": ["1.weight", "1.bias"],
    "mlp": ["1.weight", "1.bias", "4.weight", "4.bias", "7.weight", "7.bias"],
    "smallcnn": [
        "0.weight",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "4.weight",
        "5.weight",
        "5.bias",
        "5.running_mean",
        "5.running_var",
        "5.num_batches_tracked",
        "10.weight",
        "10.bias",
        "12.weight",
        "12.bias",
    ],
    "smallcnn_tiny_nobn": ["0.weight", "0.bias", "2.weight", "2.bias", "6.weight", "6.bias", "8.weight", "8.bias"],
}


@pytest.mark.parametrize(
    "name, model",
    [
        ("linear", lambda: Linear().build((5,), 3)),
        ("mlp", lambda: MLP(hidden=(7, 4), dropout=0.1).build((5,), 3)),
        ("smallcnn", lambda: SmallCNN(channels=(4, 8), hidden=16).build((1, 8, 8), 10)),
        ("smallcnn_tiny_nobn", lambda: SmallCNN(channels=(4, 8), hidden=16, batch_norm=False).build((3, 2, 2), 10)),
    ],
)
def test_state_dict_keys_and_parameter_order_are_unchanged(name, model):
    built = model()
    assert list(built.state_dict()) == OLD_KEYS[name]
    assert [n for n, _ in built.named_parameters()] == [k for k in OLD_KEYS[name] if k.endswith(("weight", "bias"))]
    # an old checkpoint (a plain nn.Sequential's state dict with these keys) loads strictly
    old = nn.Sequential(*built)
    built.load_state_dict(old.state_dict(), strict=True)


def test_logits_are_the_representation_only_when_features_cannot_train():
    assert logits_as_representation(Linear().build((5,), 3))
    assert not logits_as_representation(MLP(hidden=(4,)).build((5,), 3))
    assert not logits_as_representation(SmallCNN(channels=(2,), hidden=4).build((1, 4, 4), 3))
    assert not logits_as_representation(ResNet10().build((3, 8, 8), 3))
    mlp = MLP(hidden=(4,)).build((5,), 3)
    for p in mlp[:-1].parameters():
        p.requires_grad_(False)  # a frozen encoder in front of the head: its output cannot move either
    assert logits_as_representation(mlp)


def test_a_model_without_the_contract_is_named_in_the_error():
    with pytest.raises(TypeError, match="Sequential does not follow the model contract"):
        check_contract(nn.Sequential(nn.Linear(3, 2)))
    with pytest.raises(TypeError, match="does not follow the model contract"):
        logits_as_representation(nn.Linear(3, 2))


class ProjectedHead(nn.Module):
    """Contract model whose last-registered nn.Linear is *not* the head: features = proj(body(x)), 6-d."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(6, classes)
        self.body = nn.Linear(dim, 9)
        self.proj = nn.Linear(9, 6)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(torch.relu(self.body(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ProjectedHeadSpec(ModelSpec):
    def build(self, input_shape, num_classes):
        return ProjectedHead(input_shape[0], num_classes)


def test_fedproto_prototypes_live_in_the_feature_space_the_model_declares(tmp_path):
    """The old "input of the last nn.Linear" guess would give 9-d prototypes here (proj's input)."""
    head_federation(tmp_path, rounds=1, model=ProjectedHeadSpec(), method=FedProto()).fit()
    protos = load_checkpoint(tmp_path).server_state["protos"]
    assert protos.shape == (3, 6)


def test_moon_runs_on_a_contract_model_whose_head_is_not_the_last_linear(tmp_path):
    head_federation(tmp_path, rounds=2, model=ProjectedHeadSpec(), method=MOON()).fit()
    ckpt = load_checkpoint(tmp_path)
    assert all(torch.isfinite(v).all() for v in ckpt.global_weights.values())
    assert set(ckpt.client_states[0]["prev"]) == set(ProjectedHead(8, 3).state_dict())
