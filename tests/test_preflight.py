"""Errors before work (issue 32, item 4): an accelerator this machine lacks and pretrained weights that cannot be
loaded stop `flsuite fit` with one line naming the key, the file and the fix (exit 2), before the data is built, a run
folder is created or a W&B run is started."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
import torch
import torchvision

from flsuite.data.builtin import UCIDigitsDomains
from flsuite.models import backbones
from flsuite.models.backbones import ResNet18
from flsuite.models.weights import WeightsUnavailableError
from flsuite.preflight import accelerator_available, check_devices, device_available
from tests.helpers import SMALL_CONFIG, run_cli, write_config

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = ROOT / "configs" / "fedcir" / "gpu" / "office_caltech10.yaml"
RESNET18_FILE = Path(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url).name


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA (or MPS)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def offline_empty_caches(monkeypatch, tmp_path):
    """Fresh, empty torch hub and Hugging Face caches, and no network: every download fails as it does offline."""
    torch_home, hf_home = tmp_path / "torch_home", tmp_path / "hf_home"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(backbones, "_STATE_DICTS", {})
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_home / "hub"))  # read when imported, before setenv

    def unreachable(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torch.hub, "urlopen", unreachable)  # what torch.hub.download_url_to_file opens
    return torch_home


@pytest.fixture
def data_never_built(monkeypatch):
    """Building the data fails loudly (not as a user error): a check that ran after it would surface this instead."""

    def build(self, seed):
        raise AssertionError("the data was built before the preflight error")

    monkeypatch.setattr(UCIDigitsDomains, "build", build)


def nothing_written(tmp_path: Path) -> bool:
    """No run folder under the test's output_dir, and no W&B folder anywhere under the test's folder."""
    return not (tmp_path / "runs").exists() and not any(p.name == "wandb" for p in tmp_path.rglob("*"))


def config(tmp_path: Path, **changes) -> Path:
    """SMALL_CONFIG with W&B on (offline), writing under tmp_path/runs."""
    return write_config(
        tmp_path / "run.yaml",
        {**SMALL_CONFIG, "output_dir": str(tmp_path / "runs"), "wandb": {"enabled": True}, **changes},
    )


# ---- devices -------------------------------------------------------------------------------------------------
def test_unavailable_accelerator_stops_before_any_work_naming_key_value_machine_and_fix(
    tmp_path, capsys, no_cuda, data_never_built
):
    code, out, err = run_cli(["fit", "--config", str(config(tmp_path)), "--local.accelerator", "gpu"], capsys)
    assert code == 2
    assert (
        err.startswith("flsuite: error: local.accelerator 'gpu' needs a device") and err.count("\n") == 1 and out == ""
    )
    assert "cpu only; CUDA not available" in err and "--local.accelerator cpu" in err and "on the command line" in err
    assert nothing_written(tmp_path)


def test_eval_device_and_accelerator_from_a_config_file_name_the_file(tmp_path, capsys, no_cuda, data_never_built):
    cfg = config(tmp_path, eval_device="cuda", local={**SMALL_CONFIG["local"], "accelerator": "cuda"})
    code, _, err = run_cli(["fit", "--config", str(cfg)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert (
        "local.accelerator 'cuda' and eval_device 'cuda' need a device" in err
        and "--local.accelerator cpu --eval_device cpu" in err
    )
    assert f"(local.accelerator and eval_device set in {cfg})" in err
    assert nothing_written(tmp_path)


def test_device_checks_follow_what_the_machine_has(monkeypatch, no_cuda):
    assert accelerator_available("cpu") and accelerator_available("auto") and device_available("cpu")
    assert not accelerator_available("gpu") and not accelerator_available("cuda") and not device_available("cuda:0")
    assert not accelerator_available("no-such-accelerator") and not device_available("no-such-device")
    assert check_devices("cpu", "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_devices("gpu", "cuda") is None and check_devices("cuda", "cuda:0") is None
    message, keys = check_devices("gpu", "cuda:1") or ("", ())
    assert (
        keys == ("eval_device",) and "eval_device 'cuda:1' needs a device" in message and "CUDA (1 GPU(s))" in message
    )


# ---- pretrained weights --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "key"),
    [
        (
            {"class_path": "flsuite.models.backbones.ResNet18", "init_args": {"pretrained": True}},
            "model.init_args.pretrained",
        ),
        (
            {
                "class_path": "flsuite.models.probabilistic.ProbabilisticEncoder",
                "init_args": {"backbone": {"class_path": "ResNet18", "init_args": {"pretrained": True}}},
            },
            "model.init_args.backbone.init_args.pretrained",
        ),
    ],
)
def test_absent_pretrained_weights_offline_stop_before_any_work_saying_where_the_file_goes(
    tmp_path, capsys, offline_empty_caches, data_never_built, model, key
):
    cfg = config(tmp_path, model=model)
    code, out, err = run_cli(["fit", "--config", str(cfg)], capsys)
    assert code == 2 and err.count("\n") == 1 and out == ""  # torch.hub's "Downloading: ..." line is not shown
    assert str(offline_empty_caches / "hub" / "checkpoints" / RESNET18_FILE) in err
    assert f"set {key}: false" in err and f"({key} set in {cfg})" in err and "Traceback" not in err
    assert nothing_written(tmp_path)


def test_cached_weights_are_read_without_the_network(offline_empty_caches):
    """The real loading path: a file in torch.hub's cache is what `pretrained` loads (the download is never tried)."""
    reference = torchvision.models.resnet18().state_dict()
    (offline_empty_caches / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(reference, offline_empty_caches / "hub" / "checkpoints" / RESNET18_FILE)
    spec = ResNet18(pretrained=True)
    spec.preflight()
    model = spec.build((3, 32, 32), 10)
    assert torch.equal(model.layer1[0].conv1.weight, reference["layer1.0.conv1.weight"])


def test_unreadable_cached_weights_say_so(offline_empty_caches):
    (offline_empty_caches / "hub" / "checkpoints").mkdir(parents=True)
    (offline_empty_caches / "hub" / "checkpoints" / RESNET18_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsUnavailableError, match="cannot be read .* delete it to download it again"):
        ResNet18(pretrained=True).preflight()


def test_the_shipped_gpu_config_on_a_cpu_machine_offline_gives_one_line_and_writes_nothing(
    tmp_path, capsys, no_cuda, offline_empty_caches
):
    code, out, err = run_cli(["fit", "--config", str(GPU_CONFIG), "--output_dir", str(tmp_path / "runs")], capsys)
    assert code == 2 and err.count("\n") == 1 and out == ""
    assert (
        "local.accelerator 'gpu' and eval_device 'cuda' need a device" in err and "cpu only; CUDA not available" in err
    )
    assert (
        str(offline_empty_caches / "hub" / "checkpoints" / RESNET18_FILE) in err
        and "model.init_args.backbone.init_args.pretrained: false" in err
    )
    assert f"set in {GPU_CONFIG})" in err
    assert nothing_written(tmp_path)


def test_openclip_weights_offline_say_where_the_cache_is(tmp_path, capsys, offline_empty_caches):
    """A frozen encoder loads its weights while the config is parsed: jsonargparse's union dump is replaced by the
    encoder's own one-line error (the cache it looked in, or `checkpoint:`)."""
    pytest.importorskip("open_clip")
    data = {
        "class_path": "flsuite.data.benchmarks.Benchmark",
        "init_args": {
            "suite": "pacs",
            "root": str(tmp_path / "pacs"),
            "encoder": {"class_path": "OpenCLIP", "init_args": {"model_name": "ViT-B-16"}},
        },
    }
    code, _, err = run_cli(["fit", "--config", str(config(tmp_path, data=data))], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "Could not download open_clip weights 'ViT-B-16'/'openai'" in err and "checkpoint:" in err
    assert (
        "Union" not in err
        and str(tmp_path / "hf_home" / "hub" / "models--timm--vit_base_patch16_clip_224.openai") in err
    )
    assert nothing_written(tmp_path)
