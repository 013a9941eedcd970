"""``-q`` means quiet: a CLI capture prints nothing on stdout or stderr — neither layerscope's own
lines nor the profiler's (kineto's ``USDT: ... profiler_start`` notices) — short of errors."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.cli import main

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


SCRIPT = """\
import os, warnings
import torch
print(os.environ.get("KINETO_LOG_LEVEL"))
warnings.warn("the script's own warning")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_quiet_run_leaves_the_script_its_environment_and_warnings(tmp_path: Path) -> None:
    # Kineto reads its log level when torch first prepares a trace (here at the script's start:
    # --steps warms up from the first step), then the variable is gone from the script's environment.
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run.json"
    ran = _layerscope("run", "-q", "--steps", "1", "-o", str(out), str(script))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "None\n"
    assert "UserWarning: the script's own warning" in ran.stderr
    assert [line for line in ran.stderr.splitlines() if "the script's own warning" not in line] == []
    ls.load(out).validate()


def test_quiet_in_process_restores_environment_and_warning_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    filters = list(warnings.filters)
    argv = ["profile", f"{FACTORY}:small_mlp", "--input", "4x8", "-q", "-o", str(tmp_path / "p.json")]
    assert main(argv) == 0
    assert "KINETO_LOG_LEVEL" not in os.environ
    assert warnings.filters == filters
    assert capsys.readouterr() == ("", "")
