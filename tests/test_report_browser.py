"""The report's HTML in a real browser: headless Chromium renders report.html from a fixture run directory; its
DOM holds the verdict box and the tables, and its screenshot is a page (not blank), the verdict box on top. Skips
where no chromium is on PATH (`apt-get install chromium`); bench/check_report.sh does the same check by hand."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specpilot.loop.report import write_report
from tests.test_report import R2, new_summary, write_run

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium or chromium-browser on PATH")
VERDICT_BOX = (241, 248, 233)  # .verdict's background (#f1f8e9)


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_the_report_renders_in_chromium(tmp_path):
    from PIL import Image

    _, page = write_report(write_run(tmp_path / "run", new_summary()))
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    head, _, rest = dom.stdout.partition('<div id="verdict" class="verdict">')
    assert rest and "<table" not in head  # the verdict comes before every table
    assert f"<b>Verdict.</b> Best: <b><code>{R2}</code></b>" in rest and "416 tokens/s" in rest
    # the rounds, then rounds 1 and 2 each: its gates and its candidates (round 3 gated and predicted none)
    assert dom.stdout.count("<table>") == 5 and 'src="data:image/png;base64,' in dom.stdout
    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri())
    assert run.returncode == 0 and shot.is_file() and shot.stat().st_size > 0, run.stderr
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2000) and len(img.getcolors(1 << 24)) > 50  # not an empty page
    top = img.crop((0, 0, 1280, 600)).getcolors(1 << 24)
    assert any(all(abs(a - b) <= 3 for a, b in zip(c, VERDICT_BOX, strict=True)) for _, c in top)
