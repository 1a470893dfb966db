"""Tests for flsuite.data.syn_digits and the fonts it renders from (flsuite.data.digit_fonts)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from flsuite.data import digit_fonts
from flsuite.data.digit_fonts import discover_fonts
from flsuite.data.image_arrays import DIGIT_CLASSES
from flsuite.data.syn_digits import render_syn_digits

FONTS = discover_fonts()
pytestmark = pytest.mark.skipif(not FONTS, reason="no TrueType font with digits on this machine")


def test_deterministic_per_seed_and_seed_dependent() -> None:
    a, b = render_syn_digits(300, seed=7), render_syn_digits(300, seed=7)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    c = render_syn_digits(300, seed=8)
    assert not torch.equal(a.x, c.x) and not torch.equal(a.y, c.y)


def test_shape_dtype_and_balanced_classes() -> None:
    d = render_syn_digits(200, seed=0)
    assert d.x.shape == (200, 3, 32, 32) and d.x.dtype == torch.uint8 and d.y.dtype == torch.int64
    assert d.classes == DIGIT_CLASSES
    assert torch.bincount(d.y, minlength=10).tolist() == [20] * 10
    assert sorted(render_syn_digits(10, seed=3).y.tolist()) == list(range(10))
    assert render_syn_digits(16, seed=0, size=48).x.shape == (16, 3, 48, 48)
    assert render_syn_digits(0, seed=0).x.shape == (0, 3, 32, 32)


def test_digits_are_visible() -> None:
    d = render_syn_digits(200, seed=1)
    luma = (d.x.float() * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1)
    spread = luma.flatten(1).quantile(0.98, dim=1) - luma.flatten(1).quantile(0.02, dim=1)
    # every image has ink that stands out from its background (thin, blurred glyphs are the
    # faintest: ~25 luma levels), and typical images are high-contrast
    assert float(spread.min()) > 15 and float(spread.median()) > 60
    # colours vary across images (not a fixed palette)
    assert float(d.x.float().mean(dim=(2, 3)).std(dim=0).min()) > 30


def test_explicit_single_font_is_used(tmp_path: Path) -> None:
    one = render_syn_digits(50, seed=2, fonts=[FONTS[0]])
    other = render_syn_digits(50, seed=2, fonts=[FONTS[-1]]) if len(FONTS) > 1 else None
    assert one.x.shape == (50, 3, 32, 32)
    if other is not None and FONTS[0].name != FONTS[-1].name:
        assert torch.equal(one.y, other.y) and not torch.equal(one.x, other.x)
    with pytest.raises(FileNotFoundError, match=r"missing\.ttf"):
        render_syn_digits(5, seed=0, fonts=[tmp_path / "missing.ttf"])


def test_no_fonts_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="no usable TrueType font"):
        render_syn_digits(5, seed=0, fonts=[])
    monkeypatch.setattr(digit_fonts, "_fc_list_fonts", lambda: [])
    monkeypatch.setattr(digit_fonts, "_SYSTEM_FONT_DIRS", ())
    monkeypatch.setattr(digit_fonts, "_matplotlib_fonts", lambda: [])
    assert discover_fonts() == []
    with pytest.raises(FileNotFoundError, match="no usable TrueType font"):
        render_syn_digits(5, seed=0)


def test_symbol_fonts_are_rejected() -> None:
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("matplotlib not installed")
    ttf = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf"
    if not (ttf / "cmsy10.ttf").is_file() or not (ttf / "cmr10.ttf").is_file():
        pytest.skip("matplotlib's Computer Modern fonts not present")
    assert not digit_fonts._renders_digits(str(ttf / "cmsy10.ttf"))  # '0'..'9' are math symbols there
    assert digit_fonts._renders_digits(str(ttf / "cmr10.ttf"))
    names = [p.name for p in FONTS]
    assert "cmsy10.ttf" not in names and len(names) == len(set(names))


def test_labels_follow_seeded_permutation() -> None:
    d = render_syn_digits(25, seed=11)
    expected = np.random.default_rng(11).permutation(np.arange(25) % 10)
    assert d.y.tolist() == expected.tolist()


def test_the_machines_fonts_do_not_change_the_rendered_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default fonts are matplotlib's (the same on every machine with that matplotlib): a font the machine has
    installed, as `fc-list` reports it, changes nothing unless asked for. It did before: installing a font package
    here changed a committed FedEGG run, whose guiding set holds SYN digits."""
    folder = digit_fonts.bundled_font_folder()
    assert folder is not None and (folder / "cmr10.ttf").is_file()
    before = render_syn_digits(60, seed=5)
    extra = tmp_path / "AAExtraSerif.ttf"  # sorts first among the machine's fonts
    extra.write_bytes((folder / "cmr10.ttf").read_bytes())
    monkeypatch.setattr(digit_fonts, "_fc_list_fonts", lambda: [extra])
    after = render_syn_digits(60, seed=5)
    assert torch.equal(before.x, after.x) and torch.equal(before.y, after.y)
    assert extra not in discover_fonts() and discover_fonts(include_system=True)[0] == extra
    with_machine_fonts = render_syn_digits(60, seed=5, fonts=discover_fonts(include_system=True))
    assert not torch.equal(before.x, with_machine_fonts.x)  # the opt-in does use them
