"""The detailed steps' schedule (``detail_every``, ``detail_budget``): the spacing rule on given
step times, and on a real recorder, where a detailed step costs far more than a tiny model's step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.capture.detail_schedule import COST_STEPS, MAX_COST_STEPS, DetailSchedule
from tests.test_flight_recorder import Net, loaded, train

MS = 1_000_000  # ns


def _run(
    schedule: DetailSchedule, steps: range, wall: int, detailed_wall: int, median_us: float
) -> list[int]:
    """Steps through ``schedule`` as the recorder does; the detailed steps taken."""
    taken = []
    for step in steps:
        if schedule.due(step):
            schedule.started(step, median_us)
            taken.append(step)
        schedule.see(step, detailed_wall if schedule.costs(step) else wall)
    return taken


def test_without_a_budget_every_n_th_step_is_detailed() -> None:
    schedule = DetailSchedule(every=4, budget=None)
    assert _run(schedule, range(13), MS, 100 * MS, 1000.0) == [4, 8, 12] and schedule.taken == 3
    # the cost is measured all the same: 99 ms above the median in each of the COST_STEPS steps
    # (step 8's; step 12's steps have not all ended)
    assert schedule.last_cost_us == pytest.approx(COST_STEPS * 99_000.0)
    assert DetailSchedule(every=0, budget=None).due(5) is False
    # without a budget the windows may overlap: every step is detailed at every=1
    assert _run(DetailSchedule(every=1, budget=None), range(6), MS, 9 * MS, 1000.0) == [1, 2, 3, 4, 5]


def test_a_budget_spaces_the_next_detailed_step_by_the_measured_cost() -> None:
    schedule = DetailSchedule(every=10, budget=0.01)
    assert not schedule.due(9) and schedule.due(10)
    schedule.started(10, median_us=1000.0)
    walls = {10: 31 * MS, 11: 22 * MS, 12: MS // 2}  # 30 + 21 ms above the median; below counts 0
    for step in range(10, 10 + COST_STEPS):
        assert schedule.costs(step) and schedule.profiled(step) == (step < 12)
        schedule.see(step, walls[step])
    assert schedule.last_cost_us == pytest.approx(51_000.0)
    # 51 ms of detail is 1% of 5,100 steps of 1 ms: the next one waits that long
    assert schedule.next_step == 10 + math.ceil(51_000.0 / (0.01 * 1000.0))
    assert not schedule.due(5_000) and schedule.due(5_110)
    assert not schedule.costs(13)


def test_a_cheap_detailed_step_keeps_detail_every() -> None:
    schedule = DetailSchedule(every=10, budget=0.5)
    schedule.started(10, median_us=1000.0)
    for step in range(10, 10 + COST_STEPS):
        schedule.see(step, 2 * MS)  # 3 ms in all: 6 steps at 50%
    assert schedule.next_step == 20


def test_under_a_budget_the_next_detailed_step_waits_for_the_last_one_s_cost() -> None:
    """detail_every below the cost's window: the windows never overlap, each cost is measured."""
    schedule = DetailSchedule(every=1, budget=0.9)
    # each detailed step costs 3 x 1 ms over a 1 ms median: 4 steps at 90%
    assert _run(schedule, range(1, 14), MS, 2 * MS, 1000.0) == [1, 5, 9, 13]
    assert schedule.last_cost_us == pytest.approx(3_000.0)


def test_the_window_grows_while_the_writer_still_reads() -> None:
    schedule = DetailSchedule(every=10, budget=0.01)
    schedule.started(10, median_us=1000.0)
    for step in range(10, 16):  # the writer busy through step 14: steps 10-15 count
        assert schedule.costs(step)
        schedule.see(step, 2 * MS, writer_busy=step < 15)
    assert not schedule.costs(16) and schedule.last_cost_us == pytest.approx(6 * 1000.0)
    capped = DetailSchedule(every=10, budget=0.01)
    capped.started(10, median_us=1000.0)
    for step in range(10, 30):
        capped.see(step, 2 * MS, writer_busy=True)
    assert capped.last_cost_us == pytest.approx(MAX_COST_STEPS * 1000.0)


def test_before_the_median_is_known_the_cost_is_not_measured() -> None:
    schedule = DetailSchedule(every=4, budget=0.01)
    schedule.started(4, median_us=None)
    for step in range(4, 4 + COST_STEPS):
        schedule.see(step, 50 * MS)
    assert schedule.last_cost_us is None and schedule.next_step == 8 and schedule.due(8)


def test_a_recorder_under_a_budget_takes_fewer_detailed_steps(tmp_path: Path) -> None:
    """A detailed step (torch's profiler started and stopped) costs milliseconds; the tiny model's
    step well under one: at 5% the second detailed step would come hundreds of steps later."""
    model = Net()
    with ls.flight_recorder(model, out=tmp_path / "a", detail_every=4, warmup=2, slow=None) as plain:
        train(model, 30, plain)
    assert plain.schedule.taken == 7  # steps 4, 8, ..., 28
    with ls.flight_recorder(
        model, out=tmp_path / "b", detail_every=4, warmup=2, slow=None, detail_budget=0.05
    ) as budgeted:
        train(model, 30, budgeted)
        dump = budgeted.dump()
    schedule = budgeted.schedule
    assert schedule.taken == 1 and schedule.last_step == 4
    assert schedule.last_cost_us is not None and schedule.last_cost_us > 0
    assert schedule.next_step > 30
    flight = loaded(dump).meta.flight
    assert flight is not None and flight.detail_budget == 0.05 and flight.detail_every == 4


def test_a_small_detail_every_with_the_default_warmup_still_measures_and_judges(tmp_path: Path) -> None:
    """detail_every=3, warm-up 10: the slow-step trigger still sees the steps no profile ran in, its
    median arrives, and from then on the budget spaces the detailed steps."""
    model = Net()
    with ls.flight_recorder(model, out=tmp_path, detail_every=3, slow=None, detail_budget=0.05) as rec:
        train(model, 45, rec)
    schedule = rec.schedule
    assert rec._slow.median_us() is not None  # the warm-up ended: 10 unprofiled steps were seen
    assert schedule.last_cost_us is not None and schedule.last_cost_us > 0
    # detailed every 4th step (3, then one cost window apart) until the median is known, then one
    assert 3 <= schedule.taken < 45 // 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"detail_every": 5, "detail_budget": 0}, "between 0 and 1"),
        ({"detail_every": 5, "detail_budget": 1.5}, "between 0 and 1"),
        ({"detail_every": 5, "detail_budget": "1%"}, "between 0 and 1"),
        ({"detail_budget": 0.01}, "give detail_every too"),
    ],
)
def test_bad_budgets_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ls.UsageError, match=message):
        ls.flight_recorder(Net(), **kwargs)  # type: ignore[arg-type]
