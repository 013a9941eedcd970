"""Capture decides each thing once: the options (frozen, checked when the session is made), the scope
plan (at block start), the marks (one session, started in one place), the schedule's actions
(torch's enum, read from torch)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerAction

import layerscope as ls
from layerscope.capture import native, scope_plan
from layerscope.capture.module_marks import ModuleMarks
from layerscope.capture.options import MODULE_SCOPE_KINDS
from layerscope.capture.schedule import action_label
from layerscope.errors import UsageError
from tests.fixtures.models import TinyMLP


def train_step(model: nn.Module) -> None:
    model(torch.randn(2, 8)).sum().backward()


def test_the_options_are_frozen_once_the_session_is_made() -> None:
    prof = ls.profile(TinyMLP(), schedule=ls.schedule(active=1), all_threads=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        prof.options.memory = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        prof.options.profiler_kwargs["record_shapes"] = True  # type: ignore[index]
    assert prof.options.scheduled
    assert isinstance(prof.options.activities, tuple)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_trace_ready": 3}, "on_trace_ready must be a callable"),
        ({"schedule": "every step"}, "schedule must be"),
        ({"module_scopes": "marks"}, "module_scopes must be one of " + ", ".join(MODULE_SCOPE_KINDS)),
        ({"activities": ["tpu"]}, "unknown activity 'tpu'; choose from cpu, cuda"),
    ],
)
def test_every_option_fails_at_construction_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        ls.profile(TinyMLP(), **options)
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_actions_are_torchs_enum_and_read_from_torch() -> None:
    """``prof.action()`` is torch's current action: asking it never calls the user's schedule."""
    inner = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    calls: list[int] = []

    def schedule(step: int) -> ProfilerAction:
        calls.append(step)
        return inner(step)

    model = TinyMLP()
    seen: list[ProfilerAction] = []
    with ls.profile(model, schedule=schedule) as prof:
        for _ in range(5):
            before = len(calls)
            seen += [prof.action(), prof.action()]
            assert len(calls) == before
            train_step(model)
            prof.step()
    assert seen[::2] == [inner(k) for k in range(5)] == seen[1::2]
    assert all(isinstance(a, ProfilerAction) for a in seen)
    assert [action_label(a) for a in seen[:8:2]] == ["wait", "warmup", "record", "record_and_save"]
    assert ls.profile(model).action() == ProfilerAction.RECORD


def test_the_scope_plan_is_made_once_at_block_start(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[scope_plan.ScopePlan] = []
    real = scope_plan.plan_scopes

    def counting(*args: Any) -> scope_plan.ScopePlan:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(scope_plan, "plan_scopes", counting)
    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(wait=1, active=1, repeat=2)) as prof:
        for _ in range(5):
            train_step(model)
            prof.step()
    assert len(made) == 1 and prof.scope_plan is made[0]
    assert len(prof.cycles) == 2
    plans = [c.profile.meta.capture.scope_plan for c in prof.cycles if c.profile.meta.capture is not None]
    assert len(plans) == len(prof.cycles) and all(plan == plans[0] for plan in plans)


def test_global_mode_folds_modules_found_later_by_the_plans_rule() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.ReLU())
    with ls.profile(depth=1) as prof:
        model(torch.randn(2, 4))
    assert [m.path for m in prof.profile.root.walk()] == ["", "Sequential"]  # the root: the block
    assert prof.scope_plan.global_mode and not prof.scope_plan.follows_schedule
    assert prof.scope_plan.why_folded("Sequential.0") is not None


@pytest.mark.skipif(native.load() is None, reason="needs the native module (layerscope native build)")
@pytest.mark.parametrize("module_scopes", ["auto", "ranges"])
def test_one_marks_session_serves_the_scopes_and_the_memory_watch(
    monkeypatch: pytest.MonkeyPatch, module_scopes: str
) -> None:
    started: list[ModuleMarks] = []
    real_start = ModuleMarks.start

    def counting_start(self: ModuleMarks) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(ModuleMarks, "start", counting_start)
    model = TinyMLP()
    with ls.profile(model, memory=True, module_scopes=module_scopes) as prof:
        instruments = prof._instruments
        assert instruments is not None and instruments.watch is not None
        assert instruments.watch.marks is instruments.marks is started[0]
        train_step(model)
    assert len(started) == 1
    profile = prof.profile
    assert profile.meta.capture.scope_plan.kinds == ("marks" if module_scopes == "auto" else "ranges")
    assert profile.find("fc1").calls == 1
    assert profile.meta.capture is not None and profile.meta.capture.memory_watch_errors == ()


@pytest.mark.parametrize("name", ["schedule", "module_scopes", "profiler_kwargs", "all_threads", "scheduled"])
def test_read_back_options_on_the_session_are_deprecated_but_answer(name: str) -> None:
    prof = ls.profile(TinyMLP(), schedule=ls.schedule(wait=0, warmup=0, active=1))
    with pytest.warns(DeprecationWarning, match=rf"prof\.{name} is deprecated.*prof\.options\.{name}"):
        value = getattr(prof, name)
    expected = getattr(prof.options, name)
    assert value == (dict(expected) if name == "profiler_kwargs" else expected)


def test_the_session_surface_is_the_lifecycle_and_its_results() -> None:
    public = {a for a in dir(ls.profile(TinyMLP())) if not a.startswith("_")}
    deprecated = {"schedule", "module_scopes", "profiler_kwargs", "all_threads", "scheduled"}
    assert public - deprecated == {
        "action", "cycles", "export_chrome_trace", "flush_pending_step", "is_running", "model",
        "on_trace_ready", "options", "profile", "recording", "scope_plan", "start", "step",
        "step_before_next_top_level_call", "step_count", "stop", "torch_profiler",
    }  # fmt: skip
