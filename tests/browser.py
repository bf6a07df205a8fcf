"""Headless chromium for the tests of self-contained HTML pages (report --html, history --html):
the page's DOM after it is laid out, and a screenshot that must not be blank."""
from __future__ import annotations

import os
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
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"]


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
    assert "http://" not in text and "https://" not in text and "<script" not in text   # self-contained
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
