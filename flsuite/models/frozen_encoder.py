"""`FrozenEncoder`, the base class of the frozen image encoders: uint8 ``[B, C, H, W]`` batches (C in {1, 3}) in,
``[B, embed_dim]`` embeddings out, always in eval mode without gradients; :meth:`FrozenEncoder.cache_key` names the
encoder, its preprocessing and a fingerprint of its weights (:func:`weights_fingerprint`) for the feature cache.
"""

from __future__ import annotations

import abc
import hashlib

import torch
from torch import Tensor, nn

__all__ = ["FrozenEncoder", "weights_fingerprint"]


def weights_fingerprint(module: nn.Module) -> str:
    """Return a blake2b hex digest over a module's state dict (names, dtypes, shapes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


class FrozenEncoder(nn.Module, abc.ABC):
    """Base class of frozen image encoders (uint8 images in, ``[B, embed_dim]`` out).

    Subclasses build their network, set :attr:`embed_dim`, implement
    :meth:`preprocess` and :meth:`encode`, describe their configuration in
    :meth:`config_key` and finally call :meth:`_freeze`.  ``train(True)`` is
    ignored, so a parent module switching to training mode cannot put
    BatchNorm layers of the encoder into batch-statistics mode.
    """

    embed_dim: int

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self._device = torch.device(device)
        self._fingerprint: tuple[tuple[int, int], ...] | None = None
        self._fingerprint_value = ""

    @property
    def device(self) -> torch.device:
        """Device the encoder's weights live on."""
        tensor = next(iter(self.parameters()), None)
        return self._device if tensor is None else tensor.device

    def _freeze(self) -> None:
        """Move to the configured device, switch to eval mode and disable gradients."""
        self.to(self._device)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> FrozenEncoder:
        """Keep the encoder in eval mode whatever ``mode`` is (it is frozen)."""
        return super().train(False)

    def weights_module(self) -> nn.Module:
        """Module whose weights determine the embeddings (fingerprinted in :meth:`cache_key`)."""
        return self

    def weights_fingerprint(self) -> str:
        """Digest of the weights, recomputed only when a tensor was replaced or modified in place."""
        tensors = self.weights_module().state_dict().values()
        state = tuple((t.data_ptr(), t._version) for t in tensors)
        if state != self._fingerprint:
            self._fingerprint_value = weights_fingerprint(self.weights_module())
            self._fingerprint = state
        return self._fingerprint_value

    def config_key(self) -> dict[str, str]:
        """Encoder settings that influence the embeddings (architecture, preprocessing)."""
        return {}

    def cache_key(self) -> dict[str, str]:
        """Identify encoder, weights and preprocessing (keys the on-disk feature cache)."""
        cls = type(self)
        return {
            "encoder": f"{cls.__module__}.{cls.__qualname__}",
            "embed_dim": str(self.embed_dim),
            **{k: str(v) for k, v in self.config_key().items()},
            "weights": self.weights_fingerprint(),
        }

    @abc.abstractmethod
    def preprocess(self, images_uint8: Tensor) -> Tensor:
        """Turn uint8 ``[B, C, H, W]`` images into the network's float input on :attr:`device`."""

    @abc.abstractmethod
    def encode(self, pixels: Tensor) -> Tensor:
        """Embed preprocessed pixels: ``[B, embed_dim]``."""

    def forward(self, images_uint8: Tensor) -> Tensor:
        """Preprocess and encode under ``torch.inference_mode``.

        Outside inference mode the result is cloned into a normal tensor so it
        can feed a trainable head (inference tensors cannot be saved for backward).
        """
        outer_inference = torch.is_inference_mode_enabled()
        with torch.inference_mode():
            features = self.encode(self.preprocess(images_uint8))
        return features if outer_inference else features.clone()
