"""The TrueType fonts SYN digits are rendered from (`flsuite.data.syn_digits`): matplotlib's bundled fonts by
default, the machine's only on request, each checked to draw ten distinct digit glyphs."""

from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
from pathlib import Path

from PIL import ImageFont

from flsuite.data.image_arrays import DIGIT_CLASSES

__all__ = ["bundled_font_folder", "discover_fonts"]

logger = logging.getLogger(__name__)

_FONT_SUFFIXES = (".ttf", ".otf")
_SYSTEM_FONT_DIRS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"))


def _fc_list_fonts() -> list[Path]:
    exe = shutil.which("fc-list")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--format=%{file}\\n"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        logger.debug("fc-list failed (%s); globbing font folders instead", e)
        return []
    return [Path(line.strip()) for line in out.splitlines() if line.strip()]


def _matplotlib_fonts() -> list[Path]:
    folder = bundled_font_folder()
    return [] if folder is None else sorted(folder.glob("*.ttf"))


_DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_UNNAMED_GLYPH = re.compile(r"^(glyph|cid|g|index)\d+$")


def _digit_glyph_names_ok(path: str) -> bool:
    """Reject fonts whose cmap maps '0'..'9' to named non-digit glyphs (TeX symbol fonts).

    Uses fontTools when installed (it comes with matplotlib); without it, accepts the font.
    """
    try:
        from fontTools.ttLib import TTFont
    except ImportError:
        return True
    try:
        with TTFont(path, lazy=True, fontNumber=0) as tt:
            cmap = tt.getBestCmap() or {}
    except Exception:  # noqa: BLE001 - any parse failure means "do not use this font"
        return False
    for digit, english in zip(DIGIT_CLASSES, _DIGIT_NAMES, strict=True):
        glyph = cmap.get(ord(digit))
        if glyph is None:
            return False
        g = glyph.lower()
        if not (g.startswith(english) or g == f"uni{ord(digit):04x}" or _UNNAMED_GLYPH.match(g)):
            return False
    return True


@functools.cache
def _renders_digits(path: str) -> bool:
    """True if the font has ten distinct, genuinely-digit glyphs (no symbol fonts, no .notdef boxes)."""
    try:
        font = ImageFont.truetype(path, 24)
    except OSError:
        return False
    if not _digit_glyph_names_ok(path):
        return False
    bitmaps = set()
    for ch in DIGIT_CLASSES:
        mask = font.getmask(ch)
        if mask.size[0] == 0 or mask.size[1] == 0:
            return False
        bitmaps.add((mask.size, bytes(mask)))
    return len(bitmaps) == 10


def bundled_font_folder() -> Path | None:
    """The folder of TrueType fonts in matplotlib's wheel (a dependency), or None without matplotlib."""
    import importlib.util

    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf"


def discover_fonts(include_system: bool = False, include_matplotlib: bool = True) -> list[Path]:
    """TrueType/OpenType fonts that render the ten digits: the machine's (only with `include_system`), then
    matplotlib's, each sorted. The default, matplotlib's alone, is the same list on every machine (module docstring).

    System fonts come from ``fc-list`` (or a glob of ``/usr/share/fonts`` and
    ``/usr/local/share/fonts`` when fc-list is absent); matplotlib's bundled fonts (DejaVu, STIX,
    Computer Modern) are added when matplotlib is installed, skipping file names already found.
    Fonts whose digit glyphs are missing, not distinct, or named as other symbols (TeX symbol
    fonts such as cmsy10/cmex10) are dropped.
    """
    groups: list[list[Path]] = []
    if include_system:
        system = _fc_list_fonts()
        if not system:
            system = [p for d in _SYSTEM_FONT_DIRS if d.is_dir() for p in d.rglob("*")]
        groups.append(sorted(set(system)))
    if include_matplotlib:
        groups.append(sorted(set(_matplotlib_fonts())))
    fonts: list[Path] = []
    seen_names: set[str] = set()  # matplotlib re-ships DejaVu: keep one copy per file name
    for group in groups:
        for p in group:
            if p.suffix.lower() not in _FONT_SUFFIXES or p.name in seen_names or not p.is_file():
                continue
            if _renders_digits(str(p)):
                seen_names.add(p.name)
                fonts.append(p)
    return fonts
