"""Headless chromium for the tests of self-contained HTML pages (report --html, history --html,
roofline --html): the page's DOM after its scripts ran (--virtual-time-budget), offline, and a
screenshot that must not be blank; layout() reads back what the page's charts drew (#cp-layout:
render/assets/charts.js) and check_layout() holds every chart to the pages' rules."""
from __future__ import annotations

import html as htmllib
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("COUNTERPROF_REQUIRE_CHROMIUM"):
    raise RuntimeError("COUNTERPROF_REQUIRE_CHROMIUM is set but chromium is not installed")
SKIP_REASON = "chromium is not installed (.ci/run installs it)"


def _flags(profile: Path) -> list[str]:
    # offline: every host name resolves nowhere and no proxy answers, so a page that fetched
    # anything (a CDN script) would draw nothing; the virtual time lets the page's scripts and
    # timers run to the end before the DOM is dumped or the screenshot taken
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            "--allow-file-access-from-files", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9", "--virtual-time-budget=10000", "--hide-scrollbars"]


# a reference to anything outside the file: a script, style sheet, image or font to fetch
REMOTE = re.compile(r"""(?:\bsrc|\bhref)\s*=\s*["']?\s*(?:https?:|//)|url\(\s*["']?\s*(?:https?:|//)|@import""", re.I)


def png_ink(png: bytes) -> float:
    """Share of the screenshot's raw scanline bytes that are not white (0xff)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return sum(1 for b in raw if b != 0xFF) / len(raw)


def render(html: Path, tmp: Path, height: int) -> str:
    """The page's DOM as chromium builds it; asserts the page is self-contained and that a
    screenshot of it (1000 x height) is not blank."""
    text = html.read_text()
    assert not REMOTE.search(text), REMOTE.search(text)         # self-contained: nothing to fetch
    flags = _flags(tmp / "chromium-profile")
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", html.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp / "shot.png"
    out = subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", f"--window-size=1000,{height}",
                          html.as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    assert png_ink(shot.read_bytes()) > 0.01, "the screenshot is blank"
    return dom.stdout


def layout(dom: str) -> dict:
    """What the page's charts drew, as the page wrote it into #cp-layout once they had drawn."""
    m = re.search(r'<pre id="cp-layout"[^>]*data-ready="1"[^>]*>(.*?)</pre>', dom, re.S)
    assert m, "the charts did not finish drawing (no #cp-layout)"
    return json.loads(htmllib.unescape(m.group(1)))


NUMBER = re.compile(r"^(run )?-?[0-9][0-9.,]*(e[+-]?[0-9]+)?(\s?[kMGTP]?)")


def check_layout(found: dict) -> None:
    """Every chart has tick labels on both axes, each a number (with its unit where the axis has
    one), none twice on an axis; no two text boxes overlap, in a chart (tick labels on its
    canvas, labels over it) or anywhere on the page (every text leaf); no text is cut without its
    whole self in its title."""
    assert found["charts"], "no chart drawn"
    for c in found["charts"]:
        assert c["x_ticks"] and (c["y_ticks"] or c["kind"] == "lanes"), c["id"]
        for t in c["x_ticks"] + c["y_ticks"]:
            assert NUMBER.match(t), (c["id"], t)
        for axis in ("x_ticks", "y_ticks"):
            assert len(set(c[axis])) == len(c[axis]), (c["id"], axis, c[axis])
        assert c["overlaps"] == [], (c["id"], c["overlaps"])
    assert found["overlaps"] == [], found["overlaps"]
    assert found["cut"] == [], found["cut"]
