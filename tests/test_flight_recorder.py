"""The flight recorder (``ls.flight_recorder``): the ring, the triggers, the dumps as profiles, and the
rule that recording never changes the program."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analysis.flight import slow_step_culprit, trigger_line
from layerscope.attribution.flight_calls import step_calls
from layerscope.capture.flight_dump import FlightDumpWarning
from layerscope.capture.signal_actions import handled_outside_python, os_handler
from layerscope.events.flight_records import PASS_END, FlightStep, backward_rows, forward_rows
from layerscope.model.profile import Profile


class Sleepy(nn.Module):
    """A linear layer whose forward (or backward) sleeps while ``delay`` is set."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.delay = 0.0
        self.in_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay and not self.in_backward:
            time.sleep(self.delay)
        y = self.linear(x)
        return _SleepInBackward.apply(y, self.delay if self.in_backward else 0.0)


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay: float) -> torch.Tensor:
        ctx.delay = delay
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.delay:
            time.sleep(ctx.delay)
        return grad, None


class Net(nn.Module):
    """Four blocks, one of them :class:`Sleepy` (``blocks.2``)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.blocks = nn.Sequential(
            nn.Sequential(nn.Linear(width, width), nn.ReLU()),
            nn.Sequential(nn.Linear(width, width), nn.Tanh()),
            Sleepy(width),
            nn.Sequential(nn.Linear(width, width), nn.ReLU()),
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def train(model: nn.Module, steps: int, rec: Any = None, before: Any = None) -> list[torch.Tensor]:
    """``steps`` SGD steps; ``before(i)`` runs before step ``i``; returns the losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    losses = []
    for i in range(steps):
        if before is not None:
            before(i)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        if rec is not None:
            rec.step()
    return losses


def loaded(path: Path) -> Profile:
    profile = ls.load(path)
    profile.validate()
    return profile


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "flight"


@pytest.fixture(params=["native", "python"])
def hooks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the native backward hooks (when built) and with the Python ones."""
    from layerscope.capture import flight_clock, native

    if request.param == "python":
        monkeypatch.setattr(flight_clock.native, "load", lambda: None)
    elif native.load() is None:
        pytest.skip("the native module is not built")
    return str(request.param)


def test_the_ring_keeps_exactly_keep_steps_and_a_manual_dump_is_a_profile(out: Path, hooks: str) -> None:
    torch.manual_seed(0)
    model = Net()
    with ls.flight_recorder(model, keep=5, out=out, slow=None) as rec:
        assert (rec.clock._native is not None) == (hooks == "native")
        train(model, 12, rec)
        assert [step.step for step in rec.ring] == [7, 8, 9, 10, 11]
        path = rec.dump()
    assert rec.dumps == [path] and path.name == "flight-step000012-manual.json.gz"
    profile = loaded(path)
    assert profile.trigger is not None and profile.trigger.reason == "manual" and profile.trigger.step == 12
    assert profile.meta.source == "flight" and profile.meta.flight is not None
    assert profile.meta.flight.keep == 5 and profile.meta.flight.steps_seen == 13
    # the five kept steps and the one running when the dump was taken (nothing ran in it)
    assert [s.step for s in profile.steps] == [7, 8, 9, 10, 11, 12]
    paths = {node.path for node in profile.modules()}
    assert paths == {path for path, _ in model.named_modules()}
    for node in profile.modules():
        assert node.calls == 5, node.path  # one call per kept step
        if node.path.endswith("linear") or node.path in ("stem", "head"):
            assert node.forward.self_cpu_us > 0 and node.backward.cpu_us > 0, node.path
    step = profile.steps[0]
    root_forward, root_backward = step.modules[""]
    assert root_forward > 0 and root_backward > 0
    assert root_forward + root_backward + step.unattributed["outside modules"] == pytest.approx(step.cpu_us)
    assert step.cpu_us == pytest.approx(step.wall_us)
    assert trigger_line(profile) == "dump() at step 12"


def test_a_slow_step_is_dumped_with_its_number_and_its_module_first(out: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    sleepy = model.blocks[2]

    def before(i: int) -> None:
        sleepy.delay = 1.0 if i == 20 else 0.0  # > 50x a loaded machine's median step (~5 ms)

    # a factor far above a busy machine's noise on sub-millisecond steps
    with ls.flight_recorder(model, keep=30, out=out, slow=50.0, warmup=5, after=2) as rec:
        train(model, 30, rec, before)
    slow = [p for p in rec.dumps if "slow_step" in p.name]
    assert [p.name for p in slow] == ["flight-step000020-slow_step.json.gz"]
    profile = loaded(slow[0])
    assert profile.trigger is not None and profile.trigger.step == 20
    assert profile.trigger.module == "blocks.2"
    assert max(s.step for s in profile.steps) == 22  # the dump waited two more steps
    culprit = slow_step_culprit(profile, 20)
    assert culprit is not None and culprit.phase == "forward" and culprit.extra_us > 150_000
    line = trigger_line(profile)
    assert line is not None and line.startswith("slow step 20: ") and line.endswith("in blocks.2 (forward)")


def test_a_slow_backward_names_the_module_and_the_phase(out: Path, hooks: str) -> None:
    torch.manual_seed(0)
    model = Net()
    sleepy = model.blocks[2]
    sleepy.in_backward = True

    def before(i: int) -> None:
        sleepy.delay = 1.0 if i == 15 else 0.0  # > 50x a loaded machine's median step (~5 ms)

    # keep=4: a step slowed by a loaded machine's noise quiets the trigger for `keep` steps only
    with ls.flight_recorder(model, keep=4, out=out, slow=50.0, warmup=5, after=1) as rec:
        train(model, 20, rec, before)
    profile = loaded(out / "flight-step000015-slow_step.json.gz")
    assert profile.trigger is not None and profile.trigger.module == "blocks.2"
    culprit = slow_step_culprit(profile, 15)
    assert culprit is not None and culprit.phase == "backward" and culprit.extra_us > 150_000
    # the sleep is in blocks.2's own backward: not in its children's, nor in the block before it
    slow_step = next(s for s in profile.steps if s.step == 15)
    assert slow_step.modules["blocks.2"][1] > 200_000
    assert slow_step.modules["blocks.2.linear"][1] < 100_000
    assert slow_step.modules["blocks.1"][1] < 100_000


class Exploding(nn.Module):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.error = error
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        if self.armed:
            raise self.error
        return y


@pytest.mark.parametrize(
    ("error", "reason"),
    [(ValueError("bad batch"), "exception"), (torch.OutOfMemoryError("CUDA out of memory. Tried"), "oom")],
)
def test_an_exception_is_dumped_naming_the_module_it_passed(out: Path, error: Exception, reason: str) -> None:
    model = nn.Sequential(nn.Linear(4, 4), Exploding(error))
    x = torch.randn(2, 4)
    with pytest.raises(type(error)), ls.flight_recorder(model, out=out) as rec:
        for i in range(5):
            model[1].armed = i == 3
            model(x).sum().backward()
            rec.step()
    assert len(rec.dumps) == 1 and reason in rec.dumps[0].name
    profile = loaded(rec.dumps[0])
    assert profile.trigger is not None
    assert (profile.trigger.reason, profile.trigger.step, profile.trigger.module) == (reason, 3, "1")
    assert type(error).__name__ in profile.trigger.message
    assert [s.step for s in profile.steps] == [0, 1, 2, 3]


def test_an_exception_in_backward_names_the_module_whose_backward_ran(out: Path, hooks: str) -> None:
    class FailingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("broken gradient")

    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return FailingBackward.apply(x * 2)

    model = nn.Sequential(nn.Linear(4, 4), Broken(), nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="broken gradient"), ls.flight_recorder(model, out=out) as rec:
        model(torch.randn(2, 4)).sum().backward()
    profile = loaded(rec.dumps[0])
    assert profile.trigger is not None and profile.trigger.module == "1"


def test_a_signal_dumps_the_running_step_and_the_handler_is_restored(out: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    model = Net()

    def before(i: int) -> None:
        if i == 4:
            os.kill(os.getpid(), signal.SIGUSR1)

    with ls.flight_recorder(model, out=out) as rec:
        train(model, 6, rec, before)
    assert signal.getsignal(signal.SIGUSR1) is previous
    (path,) = rec.dumps
    assert "signal" in path.name
    profile = loaded(path)
    assert profile.trigger is not None and profile.trigger.reason == "signal" and profile.trigger.step == 4
    assert [s.step for s in profile.steps] == [0, 1, 2, 3, 4]


def test_a_signal_handled_outside_python_is_left_alone(out: Path) -> None:
    """faulthandler.register installs a C handler Python cannot see: the recorder warns, takes no
    other signal in its place, and the operating system's action is the same after the block."""
    before = os_handler(signal.SIGUSR2)
    assert before is not None and not handled_outside_python(signal.SIGUSR2)
    model = Net()
    with tempfile.TemporaryFile("w") as sink:
        faulthandler.register(signal.SIGUSR2, file=sink)
        try:
            registered = os_handler(signal.SIGUSR2)
            assert registered not in (before, None) and handled_outside_python(signal.SIGUSR2)
            warned = pytest.warns(FlightDumpWarning, match="SIGUSR2 has a handler installed outside Python")
            with warned, ls.flight_recorder(model, out=out, signal=signal.SIGUSR2) as rec:
                train(model, 3, rec)
            assert os_handler(signal.SIGUSR2) == registered
            assert rec.dumps == []
        finally:
            faulthandler.unregister(signal.SIGUSR2)
    assert os_handler(signal.SIGUSR2) == before


def test_taking_a_signal_gives_the_operating_system_its_action_back(out: Path) -> None:
    before = os_handler(signal.SIGUSR1)
    model = Net()
    with ls.flight_recorder(model, out=out) as rec:
        assert os_handler(signal.SIGUSR1) != before  # Python's C handler runs ours
        train(model, 2, rec)
    assert os_handler(signal.SIGUSR1) == before


def test_a_signal_from_outside_is_dumped_within_a_second(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(
        "import sys, time, torch, layerscope as ls\n"
        "from torch import nn\n"
        "model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())\n"
        f"with ls.flight_recorder(model, out={str(tmp_path / 'out')!r}) as rec:\n"
        "    print('ready', flush=True)\n"
        "    while True:\n"
        "        model(torch.randn(2, 8)).sum().backward()\n"
        "        rec.step()\n"
        "        if rec.dumps:\n"
        "            print('dumped', flush=True)\n"
        "            break\n"
        "        time.sleep(0.01)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        child.send_signal(signal.SIGUSR1)
        assert child.stdout.readline().strip() == "dumped"
        assert time.monotonic() - sent < 1.0
    finally:
        child.kill()
        child.wait()
    (path,) = (tmp_path / "out").iterdir()
    assert loaded(path).trigger is not None


def test_recording_leaves_outputs_grads_rng_and_the_classes_as_they_were(out: Path) -> None:
    torch.manual_seed(0)
    plain = Net()
    recorded = Net()
    recorded.load_state_dict(plain.state_dict())
    linear_forward, sequential_forward = nn.Linear.forward, nn.Sequential.forward
    torch.manual_seed(5)
    plain_losses = train(plain, 4)
    rng_plain = torch.get_rng_state()
    torch.manual_seed(5)
    with ls.flight_recorder(recorded, out=out) as rec:
        recorded_losses = train(recorded, 4, rec)
        assert nn.Linear.forward is not linear_forward  # the class wrappers were in place
    assert torch.equal(torch.get_rng_state(), rng_plain)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, recorded_losses, strict=True))
    for a, b in zip(plain.parameters(), recorded.parameters(), strict=True):
        assert torch.equal(a, b)
    assert nn.Linear.forward is linear_forward and nn.Sequential.forward is sequential_forward
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in recorded.modules())
    assert recorded.training


def test_hooks_are_removed_when_the_loop_is_interrupted(out: Path) -> None:
    model = Net()
    linear_forward = nn.Linear.forward

    def before(i: int) -> None:
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), ls.flight_recorder(model, out=out) as rec:
        train(model, 5, rec, before)
    assert nn.Linear.forward is linear_forward
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert len(rec.dumps) == 1 and loaded(rec.dumps[0]).trigger is not None


def test_gradient_checkpointing_still_recomputes_and_counts_as_backward(out: Path, hooks: str) -> None:
    transformers = pytest.importorskip("transformers")
    del transformers
    from tests.test_program_unchanged import attention_calls, llama_step, tiny_llama

    model = tiny_llama(False)
    calls = attention_calls(model)
    plain_loss, plain_grads = llama_step(model)
    plain_calls = len(calls)
    calls.clear()
    with ls.flight_recorder(model, out=out) as rec:
        loss, grads = llama_step(model)
        rec.step()
        path = rec.dump()
    assert len(calls) == plain_calls
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    profile = loaded(path)
    # transformers re-runs the layer's forward (not its __call__) in backward: its children's calls
    # are the recomputations seen, as in a profile
    attention = profile.find("model.layers.0.self_attn")
    assert attention.calls == 1 and attention.recompute_calls == 1
    assert attention.backward.cpu_us > 0 and attention.forward.cpu_us > 0


def test_reentrant_checkpoint_of_a_whole_model_counts_as_backward(out: Path, hooks: str) -> None:
    """``checkpoint(model, x, use_reentrant=True)`` re-runs the whole model inside backward before
    any hooked node runs: those calls are recomputation, not a second forward."""
    from torch.utils.checkpoint import checkpoint

    model = Net()
    model.blocks[2].delay = 0.002  # its forward sleeps, in the run and in the re-run
    x = torch.randn(8, 16, requires_grad=True)
    with ls.flight_recorder(model, out=out) as rec:
        for _ in range(2):
            checkpoint(model, x, use_reentrant=True).square().mean().backward()
            rec.step()
        path = rec.dump()
    profile = loaded(path)
    stem = profile.find("stem")
    assert stem.calls == 2 and stem.recompute_calls == 2 and stem.backward.cpu_us > 0
    sleepy = profile.find("blocks.2")  # the re-run's sleeps are backward time: 2 steps x 2 ms at least
    assert sleepy.recompute_calls == 2 and sleepy.backward.cpu_us >= 4000
    assert sleepy.forward.cpu_us >= 4000  # the first run's sleeps (under no_grad) stay forward


def test_bad_options_are_one_line_errors() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ls.UsageError, match="keep"):
        ls.flight_recorder(model, keep=0)
    with pytest.raises(ls.UsageError, match="slow"):
        ls.flight_recorder(model, slow=0.5)
    with pytest.raises(ls.UsageError, match=r"nn\.Module"):
        ls.flight_recorder("model")  # type: ignore[arg-type]


def test_a_dump_that_cannot_be_written_is_a_warning(out: Path) -> None:
    model = nn.Linear(2, 2)
    with ls.flight_recorder(model, out=out) as rec:
        model(torch.randn(1, 2)).sum().backward()
        rec.step()
        out.rmdir()
        out.write_text("not a folder")  # (permissions would not stop root)
        with pytest.warns(FlightDumpWarning, match="could not write"):
            rec.dump()
            rec.flush()
    assert rec.dumps == []


def test_show_leads_with_the_trigger_then_the_steps(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    model = Net()
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        train(model, 3, rec)
        path = rec.dump()
    assert main(["show", str(path), "--ascii"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dump() at step 3"
    assert lines[1].replace("|", " ").split()[:3] == ["Step", "Wall", "CPU"]


def _step(forward: list[tuple[int, int, int]], backward: list[tuple[int, int]], end: int) -> FlightStep:
    return FlightStep(0, 0, end, forward_rows(forward), backward_rows(backward))


def test_backward_spans_follow_the_engine_and_nest() -> None:
    # forward: A(1) holds B(2) then C(3); D(4) after A. Rows: 0 A+, 1 B+, 2 B-, 3 C+, 4 C-, 5 A-, 6 D+, 7 D-
    forward = [(0, 1, 0), (1, 2, 0), (3, -2, 0), (4, 3, 0), (6, -3, 0), (7, -1, 0), (8, 4, 0), (9, -4, 0)]
    # backward: D starts (its exit row 7) at 20, A and C at 25 (A's output is C's), B at 30, end 40
    backward = [(20, 7), (25, 5), (25, 4), (30, 2), (40, PASS_END)]
    calls = step_calls(_step(forward, backward, 50))
    assert calls.module == [0, 1, 2, 3]
    assert calls.parent == [-1, 0, 0, -1]
    assert calls.forward_ns == [7, 2, 2, 1]
    assert calls.forward_self_ns == [3, 2, 2, 1]
    # D: 20 -> 25 (A ended before D began); C: 25 -> 30 (B ended before C began); B: 30 -> 40
    # (the pass's end); A: its own 25 -> 40, holding both
    assert calls.backward_ns == [15, 10, 5, 5]
    assert calls.backward_self_ns == [0, 10, 5, 5]
    assert calls.recompute == [False] * 4


def test_a_call_still_running_and_a_lost_mark_make_no_call() -> None:
    forward = [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, -3, 0), (5, -1, 0), (6, 2, 0)]
    calls = step_calls(_step(forward, [], 10))
    assert calls.module == [0, 2]  # A, and C inside it; B lost its exit, the last B is running
    assert calls.parent == [-1, 0]


def test_a_forward_inside_a_backward_pass_is_a_recomputation() -> None:
    # A(1) runs; in backward A's node starts at 20 and A is run again 21-24, its node starting at 26
    forward = [(0, 1, 0), (5, -1, 0), (21, 1, 0), (24, -1, 0)]
    backward = [(20, 1), (26, 3), (30, PASS_END)]
    calls = step_calls(_step(forward, backward, 40))
    assert calls.recompute == [False, True]
    assert calls.parent == [-1, 0]
    assert calls.forward_ns == [5, 0]
    assert calls.backward_ns == [10, 9]  # the re-run (21-24) and its own backward (26-30)


@pytest.fixture(autouse=True)
def no_handler_left() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR1)
    yield
    assert signal.getsignal(signal.SIGUSR1) is before


SCRIPT = """\
import sys, time, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
for i in range(25):
    model(x).sum().backward()
    if i == 15:
        time.sleep(0.2)
    optimizer.step()
    optimizer.zero_grad()
if "--fail" in sys.argv:
    raise ValueError("boom")
"""


def test_run_flight_recorder_dumps_a_whole_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "dumps"
    arguments = ["--flight-recorder", "--keep", "10", "--slow", "50", "-o", str(out), str(script), "--fail"]
    code = main(["run", *arguments])
    assert code == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err and "the script raised (exit code 1)" in err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["flight-step000015-slow_step.json.gz", "flight-step000025-exception.json.gz"]
    slow = loaded(out / names[0])
    # every module the script called, under the synthetic root, named by class then by path
    paths = {n.path for n in slow.modules()}
    assert paths == {"", "Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}
    assert slow.find("Sequential.0").calls == 10 and slow.steps[-1].step == 18
    assert slow.trigger is not None and slow.trigger.module is None  # the sleep is outside modules
    failed = loaded(out / names[1])
    assert failed.trigger is not None and failed.trigger.message == "ValueError: boom"


def test_run_flight_options_need_the_flight_recorder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layerscope.cli import main

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["run", "--keep", "5", str(script)]) != 0
    assert "add --flight-recorder" in capsys.readouterr().err
    assert main(["run", "--flight-recorder", "--steps", "3", str(script)]) != 0
    assert "give no schedule" in capsys.readouterr().err


def test_global_mode_names_an_exception_s_module(out: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), Exploding(ValueError("no")))
    model[1].armed = True
    with pytest.raises(ValueError), ls.flight_recorder(None, out=out) as rec:
        model(torch.randn(2, 4))
    profile = loaded(rec.dumps[0])
    assert profile.trigger is not None and profile.trigger.module == "Sequential.1"


def test_detail_every_saves_a_full_profile_beside_the_dumps(out: Path) -> None:
    torch.manual_seed(0)
    plain, recorded = Net(), Net()
    recorded.load_state_dict(plain.state_dict())
    plain_losses = train(plain, 12)
    # slow=50: a detailed step is 100-300x this ~0.6 ms step; 20x was a 12 ms hiccup on a busy machine
    with ls.flight_recorder(recorded, out=out, detail_every=5, warmup=2, slow=50.0) as rec:
        recorded_losses = train(recorded, 12, rec)
        path = rec.dump()
    # the detailed steps' profiler start and stop are not the job being slow
    assert not any("slow_step" in p.name for p in rec.dumps)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, recorded_losses, strict=True))
    # the dump asked for the latest detailed step (10); step 5's no dump needed: never built
    details = sorted(p.name for p in out.glob("flight-detail-*"))
    assert details == ["flight-detail-step000010.json.gz"]
    dump = loaded(path)
    assert dump.meta.flight is not None and dump.meta.flight.detail_step == 10
    assert dump.meta.flight.detail_file == str(out / details[-1])
    detail = loaded(out / details[-1])
    assert detail.op_rows and detail.totals.flops > 0 and detail.has_memory
    assert detail.find("blocks.2.linear").calls == 1
    # the light record went on through the detailed steps
    assert all(step.modules["head"][0] > 0 for step in dump.steps if step.step < 12)


def test_merge_lines_the_ranks_dumps_up_by_step(tmp_path: Path) -> None:
    from layerscope.capture.flight_dump import dump_path
    from layerscope.render.console import render_to_text
    from layerscope.render.ranks import ranks_view

    dumps = []
    for rank in (0, 1):
        torch.manual_seed(0)
        model = Net()
        sleepy = model.blocks[2]

        def before(i: int, rank: int = rank, sleepy: Sleepy = sleepy) -> None:
            sleepy.delay = 0.2 if (rank, i) == (1, 7) else 0.0

        with ls.flight_recorder(model, out=tmp_path / f"rank{rank}", keep=6, slow=None) as rec:
            train(model, 10, rec, before)
            dumps.append(rec.dump())
    merged = ls.merge([loaded(path) for path in dumps], ranks=[0, 1])
    assert [s.step for s in merged.steps] == [4, 5, 6, 7, 8, 9, 10]
    worst = max(merged.steps, key=lambda s: s.spread_us)
    assert worst.step == 7 and worst.wall_us[1] is not None and worst.wall_us[1] > 150_000
    text = render_to_text(ranks_view(merged, top=3, ascii_only=True), width=120)
    assert "steps lined up across ranks: the 3 of 7 that differ most" in " ".join(text.split())
    assert dump_path(tmp_path, 7, "signal", 3).name == "flight-step000007-signal-rank3.json.gz"


def test_the_native_hooks_share_the_python_clock() -> None:
    from layerscope.capture import native

    module = native.load()
    if module is None:
        pytest.skip("the native module is not built")
    before = time.perf_counter_ns()
    at = module.flight_now()
    after = time.perf_counter_ns()
    assert before <= at <= after


def test_native_and_python_clocks_keep_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native marks and hooks record what the Python ones do: the same marks (codes, threads),
    the same backward events (calls, pass ends), on one clock."""
    from torch.utils.checkpoint import checkpoint

    from layerscope.capture import flight_clock, native

    if native.load() is None:
        pytest.skip("the native module is not built")

    def record(folder: str) -> list[FlightStep]:
        torch.manual_seed(0)
        model = Net()
        x = torch.randn(8, 16, requires_grad=True)
        with ls.flight_recorder(model, out=tmp_path / folder, slow=None) as rec:
            model(x).sum().backward()
            rec.step()
            checkpoint(model, x, use_reentrant=True).square().mean().backward()  # a pass opened by a call
            rec.step()
            with torch.no_grad():
                model(x)
            rec.step()
        return list(rec.ring)

    native_steps = record("native")
    monkeypatch.setattr(flight_clock.native, "load", lambda: None)
    python_steps = record("python")
    for ours, theirs in zip(native_steps, python_steps, strict=True):
        assert ours.forward[:, 1:].tolist() == theirs.forward[:, 1:].tolist()
        assert ours.backward[:, 1].tolist() == theirs.backward[:, 1].tolist()
        assert ours.start_ns <= ours.forward[0, 0] and ours.forward[-1, 0] <= ours.end_ns
        assert (np.diff(ours.forward[:, 0]) >= 0).all() and (np.diff(ours.backward[:, 0]) >= 0).all()
    assert len(native_steps[0].backward) > 0 and len(native_steps[2].backward) == 0


def test_a_module_that_returns_its_input_has_no_backward_span(out: Path, hooks: str) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 4))
    with ls.flight_recorder(model, out=out) as rec:
        model(torch.randn(2, 4)).sum().backward()
        rec.step()
        path = rec.dump()
    profile = loaded(path)
    assert profile.find("1").calls == 1 and profile.find("1").backward.cpu_us == 0
    assert profile.find("0").backward.cpu_us > 0 and profile.find("2").backward.cpu_us > 0


# ----- the review's cases --------------------------------------------------------------------------------
def test_compiled_autograd_runs_with_the_hooks_in_place(out: Path, hooks: str) -> None:
    from torch._dynamo import compiled_autograd

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(2, 4)

    def step() -> torch.Tensor:
        model.zero_grad()
        loss = model(x).sum()
        with compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
        assert model[0].weight.grad is not None
        return model[0].weight.grad.clone()

    plain = step()
    with ls.flight_recorder(model, out=out) as rec:
        recorded = step()
        rec.step()
    torch._dynamo.reset()
    assert torch.equal(plain, recorded)
    assert [s.step for s in rec.ring] == [0]


def test_a_dump_after_the_block_and_two_dumps_in_one_step(out: Path) -> None:
    model = Net()
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        train(model, 3, rec)
        first, second = rec.dump(), rec.dump()
    assert first != second
    rec.step()  # outside the block: nothing happens
    assert rec.steps_seen == 3 and nn.Linear.forward.__name__ == "forward"
    after = rec.dump()
    assert after.exists() and {first, second, after} <= set(rec.dumps)
    assert [s.step for s in loaded(after).steps] == [0, 1, 2]


def test_a_slow_step_with_after_zero_and_the_median_it_was_compared_with(out: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    sleepy = model.blocks[2]

    def before(i: int) -> None:
        sleepy.delay = 1.0 if i == 8 else 0.0  # > 50x a loaded machine's median step (~5 ms)

    with ls.flight_recorder(model, keep=4, out=out, slow=50.0, warmup=5, after=0) as rec:
        train(model, 12, rec, before)
    profile = loaded(out / "flight-step000008-slow_step.json.gz")
    assert max(s.step for s in profile.steps) == 8
    assert profile.meta.flight is not None and profile.meta.flight.median_step_us is not None
    assert profile.meta.flight.median_step_us < 20_000  # the steps before it, not the slow one
    with pytest.raises(ls.UsageError, match="after"):
        ls.flight_recorder(model, keep=3, after=3)
    with pytest.raises(ls.UsageError, match="cannot be caught"):
        ls.flight_recorder(model, signal=signal.SIGKILL)


def test_an_exception_after_the_backward_names_no_module(out: Path, hooks: str) -> None:
    model = Net()
    with pytest.raises(RuntimeError), ls.flight_recorder(model, out=out) as rec:
        model(torch.randn(8, 16)).sum().backward()
        raise RuntimeError("bad batch from the data loader")
    profile = loaded(rec.dumps[0])
    assert profile.trigger is not None and profile.trigger.module is None


def test_two_backward_passes_add_up_without_the_time_between(out: Path, hooks: str) -> None:
    trunk, head_a, head_b = nn.Linear(8, 8), nn.Linear(8, 1), nn.Linear(8, 1)
    model = nn.ModuleDict({"trunk": trunk, "a": head_a, "b": head_b})
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        for _ in range(2):
            hidden = trunk(torch.randn(4, 8))
            head_a(hidden).sum().backward(retain_graph=True)
            time.sleep(0.05)
            head_b(hidden).sum().backward()
            rec.step()
        path = rec.dump()
    profile = loaded(path)
    assert profile.find("trunk").backward.cpu_us < 20_000  # two short spans, not the 50 ms between


def test_a_detailed_profile_that_cannot_start_leaves_the_steps_alone(out: Path) -> None:
    model = Net()
    with (
        torch.profiler.profile(),
        ls.flight_recorder(model, out=out, detail_every=2, slow=None) as rec,
        pytest.warns(FlightDumpWarning, match="no detailed profiles"),
    ):
        train(model, 6, rec)
    assert [s.step for s in rec.ring] == [0, 1, 2, 3, 4, 5] and rec.steps_seen == 6


def test_entering_does_not_read_cuda_devices(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def initialises_cuda(*args: Any) -> None:
        raise AssertionError("the recorder read a CUDA device (that initialises CUDA)")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", initialises_cuda)
    with ls.flight_recorder(nn.Linear(2, 2), out=out) as rec:
        rec.step()


def test_sigterm_still_ends_the_job_after_its_dump(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(
        "import signal, time, torch, layerscope as ls\n"
        "from torch import nn\n"
        "model = nn.Linear(4, 4)\n"
        f"with ls.flight_recorder(model, out={str(tmp_path / 'out')!r}, signal=signal.SIGTERM) as rec:\n"
        "    print('ready', flush=True)\n"
        "    for _ in range(3000):\n"
        "        model(torch.randn(2, 4)).sum().backward()\n"
        "        rec.step()\n"
        "        time.sleep(0.01)\n"
        "print('not ended', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
        assert child.stdout.read() == ""
    finally:
        child.kill()
    (path,) = (tmp_path / "out").iterdir()
    assert "signal" in path.name and loaded(path).trigger is not None


def test_run_flight_recorder_with_detail_every(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("range(25)", "range(6)").replace("i == 15", "i == 99"))
    out = tmp_path / "dumps"
    code = main(
        ["run", "--flight-recorder", "--detail-every", "2", "--slow", "0", "-o", str(out), str(script)]
    )
    assert code == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    # no dump: the block's end writes the latest detailed step (step 2's was never built)
    assert names == ["flight-detail-step000004.json.gz"]
    assert loaded(out / names[0]).find("Sequential.0").calls == 1


def test_run_flight_recorder_refuses_a_profile_s_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layerscope.cli import main

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["run", "--flight-recorder", "--html", str(script)]) == 2
    assert "--html belong(s) to a profile" in capsys.readouterr().err
    assert main(["run", "--flight-recorder", "-o", str(tmp_path / "d.json.gz"), str(script)]) == 2
    assert "the dumps' folder, not a file" in capsys.readouterr().err
    assert main(["run", "--slow", "0", str(script)]) == 2
    assert "add --flight-recorder" in capsys.readouterr().err
    assert main(["run", "--detail-budget", "0.01", str(script)]) == 2
    assert "--detail-budget set(s) the flight recorder" in capsys.readouterr().err
    arguments = ["--flight-recorder", "--detail-budget", "0.01", "-o", str(tmp_path / "d"), str(script)]
    assert main(["run", *arguments]) == 2
    err = capsys.readouterr().err
    assert "give detail_every too" in err and err.count("\n") == 1


def test_global_mode_bounds_its_module_list(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from layerscope.capture import flight_scopes

    monkeypatch.setattr(flight_scopes, "MAX_GLOBAL_MODULES", 6)

    class MakesModules(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.Dropout(0.0)(self.linear(x))  # a new module at every call

    model = MakesModules()
    with ls.flight_recorder(None, out=out, slow=None) as rec:
        for _ in range(20):
            model(torch.randn(2, 4)).sum().backward()
            rec.step()
        path = rec.dump()
    assert len(rec._modules) == 6  # the synthetic root, the model, its linear, three dropouts
    profile = loaded(path)
    assert profile.find("MakesModules.linear").calls == 20


def test_the_html_report_of_a_dump_leads_with_its_trigger(out: Path) -> None:
    model = Net()
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        train(model, 3, rec)
        path = rec.dump()
    profile = loaded(path)
    page = out / "dump.html"
    profile.save(page)
    text = page.read_text()
    assert '<p id="trigger"><b>Flight recorder dump</b>: dump() at step 3</p>' in text
    assert text.index('id="trigger"') < text.index('id="headline"')


class _ManyArguments(nn.Module):
    """A module called with more positional arguments than the native call keeps on its stack, and
    with keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, *xs: torch.Tensor, scale: float = 1.0, fail: bool = False) -> torch.Tensor:
        if fail:
            raise ValueError("asked to fail")
        return self.linear(torch.stack(xs).sum(0)) * scale


def test_native_calls_pass_arguments_and_errors_as_python_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native whole-call path (``flight_call``) hands the module every positional and keyword
    argument, returns the same output, closes the call's marks when it raises and lets the same
    exception through; its records are the Python path's."""
    from layerscope.capture import flight_clock, native

    if native.load() is None:
        pytest.skip("the native module is not built")

    def record(folder: str) -> tuple[list[list[float]], list[FlightStep], BaseException]:
        torch.manual_seed(0)
        model = _ManyArguments()
        xs = [torch.randn(2, 4, requires_grad=True) for _ in range(9)]
        outputs = []
        with ls.flight_recorder(model, out=tmp_path / folder, slow=None) as rec:
            assert (rec.clock.native_call is not None) == (folder == "native")
            for count in (3, 9):  # on the native call's stack, and past it
                output = model(*xs[:count], scale=0.5)
                output.sum().backward()
                outputs.append(output.detach().flatten().tolist())
                rec.step()
            with pytest.raises(ValueError, match="asked to fail") as raised:
                model(xs[0], fail=True)
            rec.step()
        return outputs, list(rec.ring), raised.value

    native_outputs, native_steps, native_error = record("native")
    monkeypatch.setattr(flight_clock.native, "load", lambda: None)
    python_outputs, python_steps, python_error = record("python")
    assert native_outputs == python_outputs
    assert type(native_error) is type(python_error)
    for ours, theirs in zip(native_steps, python_steps, strict=True):
        assert ours.forward[:, 1:].tolist() == theirs.forward[:, 1:].tolist()
        assert ours.backward[:, 1].tolist() == theirs.backward[:, 1].tolist()
    assert native_steps[2].forward[:, 1].tolist() == [1, -1]  # the raising call's marks, closed
    assert len(native_steps[0].backward) > 0


def test_a_compiled_model_traces_through_the_wrappers_without_a_break(out: Path, hooks: str) -> None:
    """Dynamo traces the class wrappers (native whole-call or Python marks) into one graph: their
    torch.compiler check keeps the marks and the native call out of it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    plain = model(x)
    torch._dynamo.reset()
    with ls.flight_recorder(model, out=out, slow=None) as rec:
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        recorded = compiled(x)
        rec.step()
    torch._dynamo.reset()
    assert torch.equal(plain, recorded)
    assert nn.Linear.forward.__name__ == "forward" and "flight" not in nn.Linear.forward.__module__


def test_a_python_light_record_is_announced_once_unless_turned_off(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the native module the light record runs in Python at several times its cost: the
    user is told once per process, naming the remedy; not when LAYERSCOPE_NATIVE=0 chose it."""
    import warnings

    from layerscope.capture import flight_clock
    from layerscope.errors import LayerscopeWarning

    monkeypatch.setattr(flight_clock, "_warned_python", False)
    monkeypatch.setattr(flight_clock.native, "load", lambda: None)
    model = Net()
    with pytest.warns(LayerscopeWarning, match="light record runs in Python") as caught:
        for _ in range(2):
            with ls.flight_recorder(model, out=out, slow=None) as rec:
                train(model, 1, rec)
    announced = [w for w in caught if "light record runs in Python" in str(w.message)]
    assert len(announced) == 1 and "layerscope native build" in str(announced[0].message)
    assert announced[0].filename == __file__  # pointed at the user's `with`
    monkeypatch.setattr(flight_clock, "_warned_python", False)
    monkeypatch.setenv("LAYERSCOPE_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerscopeWarning)
        with ls.flight_recorder(model, out=out, slow=None) as rec:
            train(model, 1, rec)
