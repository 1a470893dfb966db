"""Trainable image backbones for the end-to-end family (FKPL, FedCiR, FedEGG and the "original backbone" baselines),
as `ModelSpec`s that follow the model contract: `features(x)` is the 512-d global-average-pooled output of the last
residual stage, `head` the final `nn.Linear` (`fc`).

- `ResNet18`: torchvision's ResNet-18, optionally initialised from torchvision's ImageNet weights.
- `ResNet10`: BasicBlock with layers [1, 1, 1, 1], by default with the 3×3 stride-1 stem and no max-pool that the
  FKPL/FPL official code uses for 32×32 inputs.

Both take any number of input channels and classes, and an optional per-channel normalisation `(x − mean) / std`
applied inside `features` (so evaluation sees it too); its constants are non-persistent buffers, so they are neither
in the state dict nor communicated.
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import urllib.error
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torchvision.models import ResNet18_Weights
from torchvision.models.resnet import BasicBlock, ResNet

from flsuite.models.heads import ModelSpec
from flsuite.models.weights import WeightsUnavailableError

log = logging.getLogger(__name__)

#: torchvision's ImageNet normalisation (use it as `mean`/`std` with `pretrained: true`, on images scaled to [0, 1]).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalize(nn.Module):
    """(x − mean) / std per channel; the constants are non-persistent buffers (not in the state dict)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class ResNetClassifier(ResNet):
    """torchvision's `ResNet` with the model contract, any input channels, an optional small-input stem and an
    optional input normalisation. State-dict keys are torchvision's (`conv1.weight`, …, `fc.bias`)."""

    def __init__(
        self,
        layers: Sequence[int],
        num_classes: int,
        in_channels: int = 3,
        small_input: bool = False,
        normalize: Normalize | None = None,
    ) -> None:
        super().__init__(BasicBlock, list(layers), num_classes=num_classes)
        if small_input or in_channels != 3:
            kernel, stride, padding = (3, 1, 1) if small_input else (7, 2, 3)
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=kernel, stride=stride, padding=padding, bias=False)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init
        if small_input:
            self.maxpool = nn.Identity()
        self.normalize = normalize if normalize is not None else nn.Identity()

    @property
    def head(self) -> nn.Linear:
        return self.fc

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, C, H, W] → [batch, 512]: normalisation, stem, the four stages, global average pooling."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.normalize(x)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class _ResNetSpec(ModelSpec):
    """Shared arguments and checks of the ResNet specs."""

    layers: tuple[int, ...] = ()

    def __init__(self, small_input: bool, mean: Sequence[float] | None, std: Sequence[float] | None) -> None:
        if (mean is None) != (std is None):
            raise ValueError(f"{type(self).__name__}: give both mean and std for the input normalisation, or neither")
        if std is not None and any(s <= 0 for s in std):
            raise ValueError(f"{type(self).__name__}: std must be > 0, got {list(std)}")
        self.small_input = small_input
        self.mean = list(mean) if mean is not None else None
        self.std = list(std) if std is not None else None

    def _build(self, input_shape: tuple[int, ...], num_classes: int) -> ResNetClassifier:
        if len(input_shape) != 3:
            raise ValueError(f"{type(self).__name__} needs image inputs [C, H, W], got input shape {list(input_shape)}")
        in_channels = input_shape[0]
        normalize = None
        if self.mean is not None and self.std is not None:
            if not (len(self.mean) == len(self.std) and len(self.mean) in (1, in_channels)):
                raise ValueError(
                    f"{type(self).__name__}: mean/std need 1 or {in_channels} values (the input channels), "
                    f"got {len(self.mean)} and {len(self.std)}"
                )
            normalize = Normalize(self.mean, self.std)
        return ResNetClassifier(self.layers, num_classes, in_channels, self.small_input, normalize)


class ResNet10(_ResNetSpec):
    """ResNet-10: BasicBlock, layers [1, 1, 1, 1], 512-d features; randomly initialised (there are no standard
    ImageNet weights for it).

    Args:
        small_input: The FKPL/FPL official stem for 32×32 inputs: a 3×3 stride-1 convolution and no max-pool
            (default). False: torchvision's 7×7 stride-2 stem with max-pool (for ≥ 128 px images).
        mean: Per-channel input mean of the normalisation inside the model (1 value or one per channel); null: none.
        std: Per-channel input standard deviation (with `mean`).
    """

    layers = (1, 1, 1, 1)

    def __init__(
        self, small_input: bool = True, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
    ) -> None:
        super().__init__(small_input, mean, std)

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return self._build(input_shape, num_classes)


class ResNet18(_ResNetSpec):
    """torchvision's ResNet-18 (512-d features), optionally from torchvision's ImageNet-1k weights.

    With `pretrained`, every weight except the classifier `fc` (sized for this data's classes) comes from
    `ResNet18_Weights.IMAGENET1K_V1`; for grey (1-channel) inputs the stem's RGB filters are summed, and with
    `small_input` the 3×3 stem keeps its random initialisation (the 7×7 ImageNet filters do not fit). The file is
    downloaded once into torch.hub's cache (`$TORCH_HOME/hub/checkpoints`) and read from there afterwards; offline,
    put it there by hand.

    Args:
        pretrained: Initialise from ImageNet weights (needs the network or the cached file).
        small_input: A 3×3 stride-1 stem without max-pool, for small (e.g. 32×32) images.
        mean: Per-channel input mean of the normalisation inside the model (1 value or one per channel); null:
            none. With `pretrained`, use ImageNet's (0.485, 0.456, 0.406) on [0, 1] images.
        std: Per-channel input standard deviation (with `mean`); ImageNet's: (0.229, 0.224, 0.225).
    """

    layers = (2, 2, 2, 2)
    weights = ResNet18_Weights.IMAGENET1K_V1

    def __init__(
        self,
        pretrained: bool = False,
        small_input: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__(small_input, mean, std)
        self.pretrained = pretrained

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        model = self._build(input_shape, num_classes)
        if self.pretrained:
            load_imagenet_weights(model, imagenet_state_dict(self.weights.url))
        return model

    def preflight(self, key: str = "model") -> None:
        """With `pretrained`, read the ImageNet weights now (from the cache, else downloading them), so that their
        absence stops the run before any work, naming `<key>.init_args.pretrained`."""
        if self.pretrained:
            imagenet_state_dict(self.weights.url, setting=f"{key}.init_args.pretrained")


#: ImageNet state dicts read in this process, by URL (each client build of a pretrained model reuses it).
_STATE_DICTS: dict[str, dict[str, torch.Tensor]] = {}


def imagenet_state_dict(url: str, setting: str = "the model's pretrained") -> dict[str, torch.Tensor]:
    """The state dict at `url`, through torch.hub's download cache (`$TORCH_HOME/hub/checkpoints`); when it can be
    neither read from the cache nor downloaded, a `WeightsUnavailableError` saying where the file must go, or to set
    `setting` (the config key of `pretrained`) to false."""
    if url not in _STATE_DICTS:
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
        try:
            if cached.is_file():
                _STATE_DICTS[url] = torch.hub.load_state_dict_from_url(url, map_location="cpu", progress=False)
            else:  # torch.hub announces the download on stdout: logged once it succeeded, else replaced by the error
                with contextlib.redirect_stdout(io.StringIO()):
                    _STATE_DICTS[url] = torch.hub.load_state_dict_from_url(url, map_location="cpu", progress=False)
                log.info("downloaded the ImageNet weights %s to %s", url, cached)
        except (urllib.error.URLError, OSError, RuntimeError, pickle.UnpicklingError, EOFError) as err:
            problem = (
                f"the file in torch.hub's cache ({cached}) cannot be read ({err}); delete it to download it again"
                if cached.is_file()
                else f"the file is not in torch.hub's cache ({cached}) and downloading it failed ({err})"
            )
            raise WeightsUnavailableError(
                f"cannot load the ImageNet weights {url}: {problem}. "
                f"Download it on a machine with a network and copy it to {cached} "
                f"(or point TORCH_HOME at a folder holding hub/checkpoints/{cached.name}), or set {setting}: false",
                keys=(setting,) if "." in setting else (),
            ) from err
    return _STATE_DICTS[url]


def load_imagenet_weights(model: ResNetClassifier, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy ImageNet weights into `model`: all but `fc`; the stem summed over RGB for 1-channel inputs, left as
    initialised when its shape still does not fit (the small-input 3×3 stem)."""
    own = model.state_dict()
    weights = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
    stem = weights["conv1.weight"]
    if own["conv1.weight"].shape[1] == 1 and stem.shape[1] == 3:
        stem = stem.sum(dim=1, keepdim=True)
    weights["conv1.weight"] = stem
    if stem.shape != own["conv1.weight"].shape:
        del weights["conv1.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    allowed = {"fc.weight", "fc.bias", "conv1.weight"}
    if unexpected or set(missing) - allowed:
        raise RuntimeError(
            f"ImageNet weights do not match the model: missing {sorted(set(missing) - allowed)}, "
            f"unexpected {unexpected}"
        )
