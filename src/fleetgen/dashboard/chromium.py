"""Headless Chromium as the rasteriser of `svg`'s charts: the PNGs of `report --png` and `bench --png`.

One headless run per picture, with every background service off so it never leaves loopback. The charts
are SVG already (the live page and the report show them as they are), so no second plotting library.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from fleetgen.errors import FleetgenError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")
INSTALL_FIX = "install it: `apt-get install -y --no-install-recommends chromium` (Debian/Ubuntu)"
# Quiet, sandbox-free (containers run as root), and offline: no sync, no component updates, no QUIC.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)
SCALE = 2  # device pixels per SVG pixel: a 640-wide chart becomes a crisp 1280-pixel PNG
_SIZE = re.compile(r'<svg [^>]*width="(\d+)" height="(\d+)"')


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH, or None."""
    return next(filter(None, map(shutil.which, CANDIDATES)), None)


def require_chromium() -> str:
    """The path of Chromium, or an error naming how to install it (checked before work that ends in a PNG)."""
    binary = find_chromium()
    if binary is None:
        raise FleetgenError("Chromium is needed to render PNGs and was not found on PATH", fix=INSTALL_FIX)
    return binary


def run_chromium(*argv: str, timeout_s: float = 60.0) -> str:
    """Run headless Chromium with `argv` after the quiet, offline flags; its stdout. Blocks: use a thread."""
    binary = require_chromium()
    with tempfile.TemporaryDirectory(prefix="fleetgen-chromium-") as profile:
        command = [binary, *FLAGS, f"--user-data-dir={profile}", *argv]
        try:
            done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise FleetgenError(
                f"Chromium did not finish within {timeout_s:.0f} s",
                context={"argv": " ".join(argv)},
                fix="check that `chromium --headless` runs on this machine",
            ) from exc
    if done.returncode != 0:
        raise FleetgenError(
            f"Chromium exited with {done.returncode}",
            context={"argv": " ".join(argv), "stderr": done.stderr.decode(errors="replace")[-2000:]},
            fix="run the command above by hand to see why",
        )
    return done.stdout.decode(errors="replace")


def svg_to_png(svg: str, png: Path) -> Path:
    """Rasterise one SVG chart to `png` at its own size (× `SCALE`) on white. Blocks: use a thread."""
    size = _SIZE.search(svg)
    width, height = (int(size.group(1)), int(size.group(2))) if size else (640, 480)
    with tempfile.TemporaryDirectory(prefix="fleetgen-svg-") as tmp:
        page = Path(tmp) / "chart.html"
        page.write_text(
            f"<!doctype html><body style='margin:0;background:#fff'>{svg}</body>", encoding="utf-8"
        )
        window = [f"--window-size={width},{height}", f"--force-device-scale-factor={SCALE}"]
        run_chromium(f"--screenshot={png}", *window, "--virtual-time-budget=500", page.as_uri())
    if not (png.is_file() and png.stat().st_size > 0):
        raise FleetgenError(f"Chromium wrote no screenshot to {png}", fix="check the folder is writable")
    return png
