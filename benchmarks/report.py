"""The HTML report of a 50-step ResNet-18 training profile (memory on): how big the file is, how long
layerscope takes to write it, and how long headless Chromium takes to load and render it.

    python benchmarks/report.py --steps 50
    python benchmarks/report.py --modules 1000 --steps 5   # a 1,000-module model

Needs Debian's ``chromium`` and the ``playwright`` package (``pip install -e '.[test]'``) for the
render time; without them only the size and the write time are reported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

import layerscope as ls
from layerscope.models import resnet18
from layerscope.render.html import html_report

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def deep_model(modules: int) -> torch.nn.Module:
    """About ``modules`` modules: the root, blocks of ten (Linear, ReLU) pairs, a head."""
    pairs = max((modules - 2) * 10 // 21, 1)  # each block of ten pairs is 21 modules

    def block(n: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(*[m for _ in range(n) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())])

    blocks = [block(min(10, pairs - first)) for first in range(0, pairs, 10)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(32, 10))


def profile_training(steps: int, batch: int, size: int, modules: int | None = None) -> ls.Profile:
    """``steps`` SGD steps of resnet18 on random images (or of a ``modules``-module MLP on random
    vectors), every step recorded."""
    torch.manual_seed(0)
    model = resnet18(num_classes=10) if modules is None else deep_model(modules)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shape = (batch, 3, size, size) if modules is None else (batch, 32)
    images, labels = torch.randn(*shape), torch.randint(0, 10, (batch,))
    with ls.profile(model, memory=True, schedule=ls.schedule(active=steps, repeat=1)) as prof:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            opt.step()
            prof.step()
    return prof.profile


def render_seconds(report: Path, runs: int) -> list[float]:
    """Seconds from navigation start until the module tree and op table are drawn, per fresh page."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise RuntimeError("no chromium on PATH")
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            start = time.perf_counter()
            page.goto(report.as_uri(), wait_until="load")
            page.wait_for_selector("#ops tbody tr")
            page.wait_for_selector("#tree tbody tr")
            times.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return times


def main() -> None:
    """Profile, write the report, render it; print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--runs", type=int, default=5, help="page loads to time")
    parser.add_argument("--modules", type=int, default=None, help="an MLP of about N modules instead")
    args = parser.parse_args()
    profile = profile_training(args.steps, args.batch, args.size, args.modules)
    start = time.perf_counter()
    page = html_report(profile)
    write_s = time.perf_counter() - start
    result: dict[str, object] = {
        "steps": len(profile.steps),
        "modules": len(list(profile.modules())),
        "op_rows": len(profile.op_rows),
        "report_bytes": len(page.encode()),
        "write_s": round(write_s, 3),
    }
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        report.write_text(page, encoding="utf-8")
        try:
            times = render_seconds(report, args.runs)
        except (ImportError, RuntimeError) as exc:
            result["render_s"] = f"not measured: {exc}"
        else:
            result["render_s_median"] = round(sorted(times)[len(times) // 2], 3)
            result["render_s_max"] = round(max(times), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
