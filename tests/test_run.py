"""``layerscope run``: unmodified scripts, step boundaries from optimizer.step(), failures saved."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.cli import main

TRAIN = """
import sys
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.encoder(x))

if __name__ != "__main__":
    raise SystemExit("not run as __main__")
model, loss_fn = Net(), nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[1])
for step in range(steps):
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    if step == int(sys.argv[2]) if len(sys.argv) > 2 else False:
        raise {error}("stopped at step %d" % step)
print("trained", steps, "steps")
"""


def write_script(folder: Path, error: str = "RuntimeError") -> Path:
    path = folder / "train.py"
    path.write_text(textwrap.dedent(TRAIN.replace("{error}", error)))
    return path


def run_layerscope(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m layerscope ARGV`` in ``cwd``, as a user would start it (its own process)."""
    return subprocess.run(
        [sys.executable, "-m", "layerscope", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def saved(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json.gz"))


def test_run_script_with_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write_script(tmp_path)
    out = tmp_path / "runs"
    code = main(["run", "--steps", "3", "-o", str(out), "--ascii", "--peak-tflops", "2", str(script), "6"])
    assert code == 0
    captured = capsys.readouterr()
    assert "MFU against --peak-tflops 2" in captured.err  # run's tree honours the view options
    assert "trained 6 steps" in captured.out  # the script's own output is untouched
    files = saved(out)
    assert len(files) == 1 and files[0].name.startswith("rank0_steps1-3_")
    p = ls.load(files[0])
    p.validate()
    assert [c.path for c in p.root.children] == ["Net", "CrossEntropyLoss"]
    assert p.find("Net.encoder.0").type_name == "Linear" and p.find("Net.head").backward.cpu_us > 0
    assert len(p.steps) == 3 and p.find("Net").calls == 3
    assert "rows: totals over 3 steps" in captured.err and "saved" in captured.err
    for step in p.steps:  # steps end between optimizer steps, so no range straddles two steps
        assert step.cpu_us <= step.wall_us * 1.001


def test_run_saves_trace_and_html_per_cycle(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    out = tmp_path / "runs"
    assert main(["run", "-q", "--steps", "2", "--trace", "--html", "-o", str(out), str(script), "4"]) == 0
    profile, trace, page = saved(out), sorted(out.glob("*.pt.trace.json.gz")), sorted(out.glob("*.html"))
    assert len(profile) == 2 and len(trace) == 1 and len(page) == 1  # the glob also matches the trace
    stem = trace[0].name.removesuffix(".pt.trace.json.gz")
    assert page[0].name == f"{stem}.html"
    text = page[0].read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "Net.encoder" in text


def test_run_schedule_options_and_sys_argv(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    out = tmp_path / "runs"
    argv_before = sys.argv[:]
    code = main(
        [
            "run",
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "2",
            "--repeat",
            "2",
            "-o",
            str(out),
            "-q",
            str(script),
            "10",
        ]
    )
    assert code == 0 and sys.argv == argv_before
    files = saved(out)
    assert [f.name.split("_")[1] for f in files] == ["steps2-3", "steps6-7"]


@pytest.mark.parametrize(("error", "expected_code"), [("RuntimeError", 1), ("KeyboardInterrupt", 130)])
def test_failing_script_leaves_a_valid_profile(
    tmp_path: Path, error: str, expected_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, error)
    out = tmp_path / "runs"
    code = main(["run", "-o", str(out), str(script), "5", "2"])
    assert code == expected_code
    err = capsys.readouterr().err
    assert ("the script raised" if expected_code == 1 else "interrupted") in err
    if expected_code == 1:
        assert "RuntimeError: stopped at step 2" in err  # the script's traceback, as Python shows it
    (profile_file,) = saved(out)
    p = ls.load(profile_file)
    p.validate()
    assert p.find("Net.head").calls == 3  # steps 0, 1, 2 ran before the error


def test_system_exit_code_is_passed_through(tmp_path: Path) -> None:
    script = tmp_path / "exit.py"
    script.write_text("import sys\nsys.exit(7)\n")
    assert main(["run", "-q", "-o", str(tmp_path / "runs"), str(script)]) == 7


def test_run_module_with_dash_m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("STEPS = 4\n")
    (package / "train.py").write_text(
        "from .helper import STEPS\nimport torch\nm = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(STEPS):\n    m(torch.randn(2, 4)).sum().backward()\n    opt.step()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "-q", "--steps", "2", "-o", "runs", "-m", "pkg.train"]) == 0
    (profile_file,) = saved(tmp_path / "runs")
    assert ls.load(profile_file).find("Linear").calls == 2


ARGV_SCRIPT = """
import sys
import torch
print("ARGV", sys.argv[1:])
m = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(4):
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
"""


def test_everything_after_the_module_or_the_script_is_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As with python: run's options end at -m MODULE or at the script; what follows is theirs,
    also where it looks like ours (-q, --steps, -o) or like nothing we know (--lr)."""
    package = tmp_path / "argpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(ARGV_SCRIPT)
    (tmp_path / "train.py").write_text(ARGV_SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    theirs = ["--lr", "3e-4", "-q", "--steps", "9", "-o", "elsewhere", "--", "-m", "x"]
    for i, target in enumerate(
        (["-m", "argpkg.train"], ["-margpkg.train"], ["train.py"], ["--", "train.py"])
    ):
        assert main(["run", "--steps", "2", "-o", f"runs{i}", *target, *theirs]) == 0, target
        captured = capsys.readouterr()
        assert f"ARGV {theirs}" in captured.out, target
        assert "layerscope: step" in captured.err  # their -q is not ours
        (profile_file,) = saved(tmp_path / f"runs{i}")  # our -o and --steps, not theirs
        assert ls.load(profile_file).find("Linear").calls == 2
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    ("argv", "ours", "theirs"),
    [
        (["run", "s.py", "-q"], ["run"], ["s.py", "-q"]),
        (
            ["-v", "run", "-q", "--ste", "3", "-o", "o", "s.py"],
            ["-v", "run", "-q", "--ste", "3", "-o", "o"],
            ["s.py"],
        ),
        (
            ["run", "--wait=2", "-oout", "-m", "p", "-m", "q"],
            ["run", "--wait=2", "-oout", "-m", "p"],
            ["-m", "q"],
        ),
        (["run", "--", "-odd.py", "--", "a"], ["run"], ["-odd.py", "--", "a"]),
        (["run", "-m"], ["run", "-m"], None),  # argparse says the module is missing
        (["run", "--steps"], ["run", "--steps"], None),
        (["show", "p.json", "-m", "x"], ["show", "p.json", "-m", "x"], None),
    ],
)
def test_run_command_line_split(argv: list[str], ours: list[str], theirs: list[str] | None) -> None:
    from layerscope.cli.run_argv import split_run_command_line

    assert split_run_command_line(argv) == (ours, theirs)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "give a script"),
        (["run", "missing.py"], "does not exist"),
        (["run", "--steps", "2", "--active", "1", "x.py"], "--steps is a shortcut"),
    ],
)
def test_run_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_run_as_a_subprocess(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    done = run_layerscope(tmp_path, "run", "--steps", "2", "-o", "runs", "--ascii", str(script), "4")
    assert done.returncode == 0, done.stderr
    assert "trained 4 steps" in done.stdout and "layerscope: step" in done.stderr
    assert len(saved(tmp_path / "runs")) == 1


HOOK_CHECK = """
import sys
import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optimizer_mod

def ours() -> int:
    return (len(module_mod._global_forward_hooks) + len(module_mod._global_forward_pre_hooks)
            + len(optimizer_mod._global_optimizer_post_hooks))

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[1])
for step in range(steps):
    model(torch.randn(16, 8)).sum().backward()
    print("step", step, "hooks", ours(), "profiling", torch._C._autograd._profiler_enabled())
    opt.step()
print("done", ours())
"""


def hook_counts(out: str) -> list[int]:
    return [int(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]


def test_nothing_of_ours_remains_after_the_last_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "hooks.py"
    script.write_text(HOOK_CHECK)
    profiles = []
    for steps in ("4", "8"):  # the cycle ends with the script / four steps before it
        out = tmp_path / f"runs{steps}"
        assert main(["run", "-q", "--steps", "3", "-o", str(out), str(script), steps]) == 0
        printed = capsys.readouterr().out
        counts = hook_counts(printed)
        assert counts[:4] == [3, 3, 3, 3]  # two module hooks and the optimizer hook while recording
        # The 5th step's first module call ends the 4th step, which saves the cycle: stop there.
        assert counts[4:] == [0] * (int(steps) - 4)
        if steps == "8":  # the script runs on unprofiled, nothing of ours left
            assert printed.splitlines()[-2].endswith("hooks 0 profiling False")
            assert printed.splitlines()[-1] == "done 0"
        (profile_file,) = saved(out)
        assert profile_file.name.startswith("rank0_steps1-3_")
        profiles.append(ls.load(profile_file))
    # Stopping early changes nothing in what was recorded.
    for p in profiles:
        p.validate()
    short, long = profiles
    assert [(n.path, n.calls) for n in short.modules()] == [(n.path, n.calls) for n in long.modules()]
    assert [s.step for s in short.steps] == [s.step for s in long.steps] == [1, 2, 3]
    assert {(r.name, r.module, r.phase) for r in short.op_rows} == {
        (r.name, r.module, r.phase) for r in long.op_rows
    }


def test_progress_without_a_terminal_is_a_line_per_cycle(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    schedule = ("--warmup", "1", "--active", "2", "--repeat", "3")
    done = run_layerscope(tmp_path, "run", *schedule, "-o", "runs", str(script), "12")
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("layerscope: step")]
    # The first line, one per cycle saved, and the end; not one per step.
    assert len(progress) == 1 + 3 + 1, progress
    assert [line.split(" · ")[-1] for line in progress[:4]] == ["0 saved", "1 saved", "2 saved", "3 saved"]
    assert progress[-1].endswith("3 saved; the script goes on unprofiled")
    assert "trained 12 steps" in done.stdout and len(saved(tmp_path / "runs")) == 3
