"""``-q`` means quiet: a CLI capture prints nothing on stdout or stderr — neither layerscope's own
lines nor the profiler's (kineto's ``USDT: ... profiler_start`` notices) — short of errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FACTORY = str(Path(__file__).parent / "fixtures" / "factory.py")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _layerscope(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "layerscope", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_quiet_prints_nothing_and_loud_says_what_it_saved(tmp_path: Path) -> None:
    capture = ("profile", f"{FACTORY}:small_mlp", "--input", "4x8", "--steps", "2")
    quiet = _layerscope(*capture, "-q", "-o", str(tmp_path / "quiet.json"))
    assert quiet.returncode == 0, quiet.stderr
    assert (quiet.stdout, quiet.stderr) == ("", "")
    assert (tmp_path / "quiet.json").stat().st_size > 0
    loud = _layerscope(*capture, "-o", str(tmp_path / "loud.json"))
    assert loud.returncode == 0 and f"layerscope: saved {tmp_path / 'loud.json'}" in loud.stderr


def test_quiet_still_reports_an_error(tmp_path: Path) -> None:
    failed = _layerscope("profile", f"{FACTORY}:no_such_factory", "-q", "-o", str(tmp_path / "x.json"))
    assert failed.returncode != 0 and failed.stdout == ""
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("layerscope: error:") and "no_such_factory" in lines[0]
    assert not (tmp_path / "x.json").exists()
