"""Trainable models, selected in YAML with `class_path`. Each spec builds a fresh `nn.Module` for the data's input
shape and class count, so one config works on any dataset.

Every built model follows the model contract (`flsuite.models.representation`): `features(x)` [batch, d] and a linear
`head`, with `model(x) == model.head(model.features(x))`. The heads here and `SmallCNN` are `SequentialClassifier`s, so
their state-dict keys ("0.weight", …) and parameter order are those of a plain `nn.Sequential`: checkpoints written
before the contract existed load unchanged. Trainable image backbones (ResNet-10/18) are in
`flsuite.models.backbones`."""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from itertools import islice
from typing import cast

import torch
from torch import nn


class ModelSpec(abc.ABC):
    """Builds the federation's model for an input shape (without the batch dimension) and a number of classes; the
    model follows the contract (`features`, `head`; see `flsuite.models.representation`)."""

    @abc.abstractmethod
    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module: ...

    def preflight(self, key: str = "model") -> None:
        """Before any work: fail now (`flsuite.models.weights.WeightsUnavailableError`) if building would fail for a
        reason outside the config, e.g. pretrained weights that cannot be loaded here. `key`: this spec's dotted config
        key. By default, checks the specs held in this spec's attributes (a wrapped backbone)."""
        for name, value in vars(self).items():
            for i, spec in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(spec, ModelSpec):
                    spec.preflight(f"{key}.init_args.{name}" + (f".{i}" if isinstance(value, (list, tuple)) else ""))


class SequentialClassifier(nn.Sequential):
    """An `nn.Sequential` whose last module is the classifier `head` (an `nn.Linear`) and whose other modules are
    `features`. Same forward, state-dict keys and parameter order as the plain `nn.Sequential` it replaces."""

    @property
    def head(self) -> nn.Linear:
        return cast(nn.Linear, self[-1])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Every module but the head, in order (for a linear head over embeddings: just the flattening)."""
        for module in islice(self, len(self) - 1):
            x = module(x)
        return x


class Linear(ModelSpec):
    """A linear head Linear(p → C) over feature vectors (GGEUR's "single-layer MLP"; inputs are flattened)."""

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return SequentialClassifier(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


class MLP(ModelSpec):
    """An MLP head over feature vectors.

    Args:
        hidden: Widths of the hidden layers.
        dropout: Dropout probability after each hidden layer.
    """

    def __init__(self, hidden: Sequence[int] = (256,), dropout: float = 0.0) -> None:
        self.hidden, self.dropout = list(hidden), dropout

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if self.dropout:
                layers.append(nn.Dropout(self.dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        return SequentialClassifier(*layers)


class SmallCNN(ModelSpec):
    """A small CNN for images of any size: conv(3×3)-BN-ReLU blocks, max-pooling between them (while the image is
    at least 4 px), global average pooling, then a hidden FC layer. `features` ends after the hidden layer's ReLU.

    Args:
        channels: Output channels of each convolutional block.
        hidden: Width of the FC layer before the classifier.
        batch_norm: Use BatchNorm after each convolution (its statistics are averaged like weights).
    """

    def __init__(self, channels: Sequence[int] = (32, 64), hidden: int = 128, batch_norm: bool = True) -> None:
        self.channels, self.hidden, self.batch_norm = list(channels), hidden, batch_norm

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if len(input_shape) != 3:
            raise ValueError(f"SmallCNN needs image inputs [C, H, W], got input shape {list(input_shape)}")
        in_ch, size = input_shape[0], min(input_shape[1:])
        layers: list[nn.Module] = []
        for out_ch in self.channels:
            layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=not self.batch_norm)]
            if self.batch_norm:
                layers.append(nn.BatchNorm2d(out_ch))
            layers.append(nn.ReLU())
            if size >= 4:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            in_ch = out_ch
        layers += [
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(in_ch, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, num_classes),
        ]
        return SequentialClassifier(*layers)
