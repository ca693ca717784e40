"""Headless Chromium as a renderer: screenshots (the report's PNGs) and the DOM after scripts ran.

matplotlib is not a dependency and the charts are already SVG, so PNGs come from the browser that draws the
report anyway: one headless run per picture, with every background service off so it never leaves loopback.
"""

from __future__ import annotations

import asyncio
import shutil
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


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


async def _run(argv: list[str], timeout_s: float) -> str:
    binary = find_chromium()
    if binary is None:
        raise FleetgenError("Chromium is needed to render PNGs and was not found on PATH", fix=INSTALL_FIX)
    with tempfile.TemporaryDirectory(prefix="fleetgen-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise FleetgenError(
                f"Chromium did not finish within {timeout_s:.0f} s",
                context={"argv": " ".join(argv)},
                fix="check that `chromium --headless` runs on this machine",
            ) from exc
    if proc.returncode != 0:
        raise FleetgenError(
            f"Chromium exited with {proc.returncode}",
            context={"argv": " ".join(argv), "stderr": err.decode(errors="replace")[-2000:]},
            fix="run the command above by hand to see why",
        )
    return out.decode(errors="replace")


async def screenshot(
    url: str, png: Path, *, width: int, height: int, budget_ms: int = 2000, timeout_s: float = 60.0
) -> Path:
    """Save a `width`×`height` screenshot of `url` (a file:// or http://127.0.0.1 address) to `png`."""
    await _run(
        [f"--screenshot={png}", f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}", url],
        timeout_s,
    )
    if not await asyncio.to_thread(_is_nonempty_file, png):
        raise FleetgenError(f"Chromium wrote no screenshot to {png}", fix="check the folder is writable")
    return png


def _is_nonempty_file(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


async def dump_dom(url: str, *, budget_ms: int = 3000, timeout_s: float = 60.0) -> str:
    """The page's DOM as HTML after its scripts ran for `budget_ms` of virtual time."""
    return await _run(["--dump-dom", f"--virtual-time-budget={budget_ms}", url], timeout_s)


async def svg_to_png(svg: str, png: Path, *, width: int, height: int) -> Path:
    """Render one SVG chart to a PNG of its own size (white background)."""
    with tempfile.TemporaryDirectory(prefix="fleetgen-svg-") as tmp:
        page = Path(tmp) / "chart.html"
        page.write_text(
            f"<!doctype html><html><body style='margin:0;background:#fff'>{svg}</body></html>",
            encoding="utf-8",
        )
        return await screenshot(page.as_uri(), png, width=width, height=height, budget_ms=500)
