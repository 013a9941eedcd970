"""Regenerates docs/img/report.png, the README's picture of the HTML report: the demo's profile
(``make demo`` runs ``layerscope profile --memory``: the ResNet-18 layout, 5x3x224x224, training
steps) written as HTML, then its first 1366x768 screen taken by headless Chromium.

    .venv/bin/python docs/img/make_report_png.py        # needs Debian's chromium and playwright
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def main() -> None:
    """Profile as the demo does, write the report, screenshot its first screen."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "report.html"
        demo = [sys.executable, "-m", "layerscope", "profile", "--memory", "-q", "-o", str(page_file)]
        subprocess.run(demo, check=True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(page_file.as_uri())
            page.wait_for_selector("#tree tbody tr")
            page.screenshot(path=str(HERE / "report.png"))
            browser.close()
    print(f"wrote {HERE / 'report.png'}")


if __name__ == "__main__":
    main()
