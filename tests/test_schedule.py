"""Schedules, cycles, per-step statistics and outlier steps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import layerscope as ls
from layerscope.analysis.steps import step_rows
from layerscope.errors import UsageError
from layerscope.model.profile import StepStats
from layerscope.render.console import ops_table, render_to_text, steps_table, tree_table
from tests.fixtures.models import TinyMLP


def train(model: torch.nn.Module, prof: ls.profile, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        prof.step()


def test_schedule_calls_the_handler_once_per_cycle() -> None:
    model = TinyMLP()
    cycles: list[ls.Cycle] = []
    with ls.profile(
        model, schedule=ls.schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=cycles.append
    ) as prof:
        train(model, prof, 10)
    assert len(cycles) == 2
    assert [c.steps for c in cycles] == [(2, 3), (6, 7)]
    for cycle in cycles:
        cycle.profile.validate()
        assert len(cycle.profile.steps) == 2
        assert cycle.profile.find("fc1").calls == 2  # two recorded steps, one call each
        assert cycle.profile.meta.capture.cycle == cycle.index
    assert prof.profile is cycles[-1].profile
    assert prof.step_count == 10


def test_torch_schedule_objects_are_accepted() -> None:
    model = TinyMLP()
    with ls.profile(
        model,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda c: None,
    ) as prof:
        train(model, prof, 4)
    assert len(prof.cycles) == 1 and len(prof.profile.steps) == 3


def test_step_stats_split_by_module_and_label() -> None:
    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(active=3, repeat=1)) as prof:
        train(model, prof, 3)
    p = prof.profile
    assert [s.step for s in p.steps] == [0, 1, 2]
    for step in p.steps:
        fwd, bwd = step.modules[""]
        assert fwd > 0 and bwd > 0 and step.modules["fc1"][0] > 0
        assert fwd >= step.modules["fc1"][0]  # inclusive of children
        assert any(label.startswith("Optimizer.step#") for label in step.unattributed)
        # every microsecond of CPU time in the step is a module's or a label's
        top = sum(step.modules[""]) + sum(step.unattributed.values())
        assert top == pytest.approx(step.cpu_us, rel=1e-9)
        assert step.cpu_us <= step.wall_us * 1.001  # work inside one thread's step window
    assert sum(s.cpu_us for s in p.steps) == pytest.approx(p.totals.cpu_us, rel=1e-9)
    assert ls.load(p.save(Path(__file__).parent / ".steps.json")) == p
    (Path(__file__).parent / ".steps.json").unlink()


def test_multi_step_tree_shows_totals_by_default_and_means_when_asked() -> None:
    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(active=4, repeat=1)) as prof:
        train(model, prof, 4)

    def fc1_calls(text: str) -> str:
        fc1 = next(line for line in text.splitlines() if "-- fc1" in line)
        return [c.strip() for c in fc1.split(" | ")][2]

    # the default agrees with the op table and the HTML report: totals over the steps
    totals = render_to_text(tree_table(prof.profile, ascii_only=True), width=200)
    assert "rows: totals over 4 steps" in totals and "± step" in totals
    assert fc1_calls(totals) == "4"
    means = render_to_text(tree_table(prof.profile, ascii_only=True, per_step=True), width=200)
    assert "rows: mean per step of 4 steps" in means and "± step" in means
    assert fc1_calls(means) == "1"


def test_save_to_names_and_never_overwrites(tmp_path: Path) -> None:
    model = TinyMLP()
    saver = ls.save_to(tmp_path / "runs", trace=True, rank=3)
    for _ in range(2):  # two sessions writing the same steps into the same folder
        with ls.profile(model, schedule=ls.schedule(wait=1, active=2, repeat=1), on_trace_ready=saver) as p:
            train(model, p, 3)
    files = sorted(f.name for f in (tmp_path / "runs").iterdir())
    profiles = [f for f in files if f.endswith(".json.gz") and ".pt.trace." not in f]
    traces = [f for f in files if ".pt.trace.json.gz" in f]
    assert len(profiles) == 2 and len(traces) == 2
    assert all(f.startswith("rank3_steps1-2_") for f in profiles)
    for name in profiles:
        ls.load(tmp_path / "runs" / name).validate()


def test_print_summary_handler() -> None:
    model = TinyMLP()
    out = io.StringIO()
    with ls.profile(
        model, schedule=ls.schedule(active=3, repeat=1), on_trace_ready=ls.print_summary(file=out, top=3)
    ) as prof:
        train(model, prof, 3)
    text = out.getvalue()
    assert "cycle 0 (steps 0-2)" in text and "fc1" in text and "vs median" in text


def test_no_completed_cycle_is_a_clear_error() -> None:
    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(wait=5, active=1)) as prof:
        train(model, prof, 2)
    with pytest.raises(ls.CaptureError, match="no profiling cycle completed"):
        _ = prof.profile


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active": 0}, "active must be at least 1"),
        ({"wait": -1}, "wait must be a non-negative"),
        ({"repeat": 1.5}, "repeat must be"),
    ],
)
def test_schedule_arguments_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ls.schedule(**kwargs)  # type: ignore[arg-type]


def hand_built_steps(walls_and_loader: list[tuple[float, float]]) -> list[StepStats]:
    """Steps with a fixed model cost and a data-loader cost that varies."""
    return [
        StepStats(
            step=k,
            wall_us=wall,
            device_us=0.0,
            cpu_us=wall,
            modules={"": (300.0, 500.0), "encoder": (200.0, 300.0), "head": (100.0, 200.0)},
            unattributed={
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": loader,
                "Optimizer.step#AdamW.step": 100.0,
            },
        )
        for k, (wall, loader) in enumerate(walls_and_loader)
    ]


def test_outlier_step_names_the_data_loader() -> None:
    steps = hand_built_steps([(1000.0, 100.0), (1010.0, 110.0), (2900.0, 2000.0), (995.0, 95.0)])
    rows = step_rows(steps)
    assert [r.outlier for r in rows] == [False, False, True, False]
    assert rows[2].cause == "data loader"
    assert rows[2].cause_excess_us == pytest.approx(2000.0 - 105.0)
    text = render_to_text(steps_table(rows, ascii_only=True), width=150)
    assert "slow: data loader" in text and "1 outlier step" in text


def test_outlier_step_names_a_module() -> None:
    steps = hand_built_steps([(1000.0, 100.0)] * 4)
    slow = steps[1]
    steps[1] = StepStats(
        step=1,
        wall_us=2500.0,
        device_us=0.0,
        cpu_us=2500.0,
        modules={"": (300.0, 2000.0), "encoder": (200.0, 1800.0), "head": (100.0, 200.0)},
        unattributed=slow.unattributed,
    )
    rows = step_rows(steps)
    assert rows[1].outlier and rows[1].cause == "module encoder"
    assert not any(r.outlier for k, r in enumerate(rows) if k != 1)


def test_no_outliers_on_even_steps_or_too_few_steps() -> None:
    assert not any(r.outlier for r in step_rows(hand_built_steps([(1000.0, 100.0)] * 5)))
    assert not any(r.outlier for r in step_rows(hand_built_steps([(1000.0, 100.0), (5000.0, 100.0)])))


def test_step_outside_the_block_is_a_clear_error() -> None:
    session = ls.profile(TinyMLP())
    with pytest.raises(ls.CaptureError, match="inside the"):
        session.step()
    with session:
        session.step()
    with pytest.raises(ls.CaptureError, match="inside the"):
        session.step()


def test_step_ranges_are_steps_not_op_rows(tmp_path: Path) -> None:
    from layerscope.render.exports import collapsed_stacks, ops_csv
    from layerscope.render.html_tables import ops_html

    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(warmup=1, active=3, repeat=1)) as prof:
        train(model, prof, 4)
    p = prof.profile
    p.validate()  # modules + unattributed still add up to the totals
    assert len(p.steps) == 3
    assert not any(r.name.startswith("ProfilerStep") for r in p.op_rows)
    assert not any(r.name.startswith("ProfilerStep") for r in p.ops(group_by=("name", "module", "phase")))
    shown = [render_to_text(ops_table(p.ops())), ops_csv(p), ops_html(p.ops()), str(p)]
    assert not any("ProfilerStep" in text for text in shown)
    # The step ranges' own time stays in the totals, as the "(Python between ops)" entry.
    (between,) = [u for u in p.unattributed if u.label == "(Python between ops)"]
    assert between.metrics.self_cpu_us > 0
    lines = collapsed_stacks(p, "cpu_us").splitlines()
    assert any(line.startswith("[unattributed];(Python_between_ops);[python] ") for line in lines)
    assert abs(sum(int(line.rsplit(" ", 1)[1]) for line in lines) - p.totals.cpu_us) <= len(lines)


def test_step_rows_of_an_older_profile_are_left_out_on_load(tmp_path: Path) -> None:
    import gzip

    import orjson

    model = TinyMLP()
    with ls.profile(model, schedule=ls.schedule(active=2, repeat=1)) as prof:
        train(model, prof, 2)
    data = orjson.loads(gzip.decompress(prof.profile.save(tmp_path / "run.json.gz").read_bytes()))
    ops, strings = data["ops"], data["strings"]
    strings.append("ProfilerStep#0")  # as profiles saved before 0.2.0 had them
    for column, value in (("name", len(strings) - 1), ("phase", "other"), ("module", -1)):
        ops[column].append(value)
    for column in ("input_shapes", "scope"):
        ops[column].append(-1)
    ops["calls"].append(1)
    ops["metrics"].append(ops["metrics"][0])
    if ops.get("stack"):
        ops["stack"].append(-1)
    for column, value in (("bytes", None), ("dtype", -1)):  # op rows' bytes (0.3)
        if column in ops:
            ops[column].append(value)
    (tmp_path / "old.json").write_bytes(orjson.dumps(data))
    loaded = ls.load(tmp_path / "old.json")
    assert [r.name for r in loaded.op_rows] == [r.name for r in prof.profile.op_rows]
