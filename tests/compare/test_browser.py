"""`flsuite compare --out` rendered in a real browser: headless Chromium loads compare.html, and the rendered DOM,
a screenshot and the page's own JavaScript show its tables and a convergence PNG that actually decodes.

Needs Debian's Chromium (`apt-get install chromium`, /usr/bin/chromium); skipped without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from flsuite.compare import main
from tests.compare.test_compare import make_run

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium on PATH (Debian: apt-get install chromium)")

# Without the background-networking flags headless Chromium hangs on refused connections (no internet here).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",
]
WINDOW = (1000, 1100)
TIMEOUT_S = 60
FEDAVG = {"method": {"class_path": "flsuite.methods.fedavg.FedAvg"}}
FEDPROX = {"method": {"class_path": "flsuite.methods.fedprox.FedProx", "init_args": {"mu": 0.01}}}

# Appended to a copy of the page: after `load`, writes what the browser made of the first <img> into the body.
PROBE = """<script>
window.addEventListener('load', () => {
  const img = document.images[0], p = document.createElement('pre');
  p.id = 'probe';
  p.textContent = JSON.stringify({images: document.images.length, complete: img ? img.complete : null,
                                  width: img ? img.naturalWidth : -1, height: img ? img.naturalHeight : -1});
  document.body.appendChild(p);
});
</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with a fresh profile; its whole process group is killed if it outlives the timeout."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"chromium did not finish within {TIMEOUT_S} s: {' '.join(cmd)}")
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {' '.join(cmd)}\n{err[-2000:]}"
    return done


def dump_dom(page: Path) -> str:
    return chromium("--dump-dom", page.resolve().as_uri()).stdout


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


class Page(HTMLParser):
    """The rendered DOM's tables (rows of cell texts), images (attributes) and the probe's text."""

    def __init__(self, dom: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[dict[str, str | None]] = []
        self.probe: str | None = None
        self._cell: list[str] | None = None
        self._in_probe = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs))
        elif tag == "pre" and dict(attrs).get("id") == "probe":
            self._in_probe, self.probe = True, ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "pre":
            self._in_probe = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_probe:
            self.probe += data


def probe(page: Path) -> dict:
    """Render a copy of `page` with `PROBE` added and return what it reported about the first image."""
    copy = page.with_name(page.stem + ".probe.html")
    copy.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    reported = Page(dump_dom(copy)).probe
    assert reported is not None, f"the probe script did not run in {copy} (no <pre id=probe> in the rendered DOM)"
    return json.loads(reported)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """compare.html of two methods x two seeds x five rounds, as `flsuite compare RUNS --out DIR` writes it."""
    root = tmp_path_factory.mktemp("browser")
    for name, config, base in [("fedavg", FEDAVG, 40.0), ("fedprox", FEDPROX, 45.0)]:
        for seed in (0, 1):
            accs = [{"x": base + 8 * r + 2 * seed, "y": base - 10 + 6 * r - seed} for r in range(5)]
            make_run(
                root / "runs" / f"{name}_s{seed}",
                accs,
                2,
                bytes_up=[1000 + 10 * r for r in range(5)],
                config=config | {"seed": seed},
            )
    out = root / "report"
    assert main([str(root / "runs"), "--out", str(out), "--title", "Browser check"]) == 0
    return out / "compare.html"


def test_rendered_dom_has_both_tables_and_the_embedded_plot(report: Path):
    dom = dump_dom(report)
    page = Page(dom)
    assert "<h2>Browser check</h2>" in dom
    assert len(page.tables) == 3, (
        f"expected the accuracy, paired-difference and cost tables, the browser rendered {len(page.tables)}"
    )
    accuracy, paired, cost = page.tables
    assert accuracy[0] == ["method", "x", "y", "AVG", "STD", "STD (n-1)", "seeds"]
    assert cost[0][:3] == ["method", "last-k", "rounds to target"]
    for table in (accuracy, cost):
        assert [row[0] for row in table[1:]] == ["FedAvg", "FedProx"]
    # FedProx's AVG is 5 above FedAvg's on both seeds: SE 0, an interval of one point, resolved
    assert paired == [
        ["method", "Δ AVG vs FedAvg", "SE", "95 % interval", "pairs", "verdict"],
        ["FedProx", "+5.00", "0.00", "[+5.00, +5.00]", "2", "resolved"],
    ]
    assert "<td>FedAvg</td>" in dom and "<td>FedProx</td>" in dom
    assert [row[-1] for row in accuracy[1:]] == ["2", "2"]  # two seeds each
    assert len(page.images) == 1 and page.images[0]["alt"] == "convergence"
    assert page.images[0]["src"].startswith("data:image/png;base64,")  # embedded: nothing fetched
    assert not re.search(r"""(src|href)=["']?https?:""", dom)


def test_embedded_png_decodes_in_the_browser(report: Path):
    expected = png_size((report.parent / "convergence.png").read_bytes())
    seen = probe(report)
    assert seen["images"] == 1 and seen["complete"] is True
    assert seen["width"] > 0, f"the browser could not decode the embedded convergence PNG: {seen}"
    assert (seen["width"], seen["height"]) == expected


def test_probe_sees_a_corrupted_png(report: Path, tmp_path: Path):
    """The negative control: the same page with its base64 damaged is loaded but decodes to nothing."""
    broken = tmp_path / "compare.html"
    page = report.read_text()
    start = page.index("base64,") + len("base64,")
    broken.write_text(page[:start] + "AAAA" * 16 + page[start + 64 :])
    seen = probe(broken)
    assert seen["images"] == 1 and seen["width"] == 0, seen


def test_screenshot_is_a_full_window_image_showing_the_plot(report: Path, tmp_path: Path):
    from PIL import Image

    shot = tmp_path / "compare.png"
    chromium(f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", report.resolve().as_uri())
    assert png_size(shot.read_bytes()) == WINDOW
    with Image.open(shot) as img:  # decodes the whole image: a truncated or corrupt PNG raises here
        pixels = np.asarray(img.convert("RGB"), dtype=np.int16)
    assert pixels.shape == (WINDOW[1], WINDOW[0], 3)
    # This page shows ~17k dark pixels (text, the plot's axes) and ~5k coloured ones; without its <img>, ~13k dark
    # and none coloured: the page itself is black on white with grey borders.
    dark = int((pixels.max(axis=2) < 80).sum())
    coloured = int((pixels.max(axis=2) - pixels.min(axis=2) > 60).sum())  # only the plot's lines and bands
    assert dark > 2000, f"the screenshot is nearly blank ({dark} dark pixels)"
    assert coloured > 1000, f"the screenshot shows no plot ({coloured} coloured pixels)"
