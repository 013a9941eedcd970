"""Every zoo case against every check that applies to it (``checks.py`` says what each compares and
lists the documented exceptions).

Each test is parametrized by ``case_id`` with module scope, so pytest runs a case's tests together
and the case is built and run once (``conftest.py``); a failure names the model, the check, and the
figures behind it.
"""

from __future__ import annotations

import pytest

from tests.realmodels.conftest import why_no_zoo

if why_no_zoo():
    pytest.skip(str(why_no_zoo()), allow_module_level=True)

from tests.realmodels.checks import CHECKS, applies
from tests.realmodels.models import CASES
from tests.realmodels.runs import ZooRun


def _cases(check: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case_id", [c.id for c in CASES if applies(c, check)], scope="module")


def _assert(check: str, run: ZooRun) -> None:
    result = CHECKS[check](run)
    assert result.ok, f"{run.case.id} {check}: {result.figure}\n{result.detail}"


@_cases("runs")
def test_profiling_runs_and_the_profiles_validate(zoo_run: ZooRun) -> None:
    _assert("runs", zoo_run)


@_cases("identical")
def test_outputs_grads_and_rng_are_bit_identical_to_the_unprofiled_run(zoo_run: ZooRun) -> None:
    _assert("identical", zoo_run)


@_cases("code-paths")
def test_checkpointing_still_recomputes_and_compiled_code_is_reused(zoo_run: ZooRun) -> None:
    _assert("code-paths", zoo_run)


@_cases("self-cpu")
def test_op_self_cpu_matches_key_averages(zoo_run: ZooRun) -> None:
    _assert("self-cpu", zoo_run)


@_cases("flops")
def test_flops_match_flop_counter_mode(zoo_run: ZooRun) -> None:
    _assert("flops", zoo_run)


@_cases("peak")
def test_absolute_peak_matches_torchs_memory_profile(zoo_run: ZooRun) -> None:
    _assert("peak", zoo_run)


@_cases("placement")
def test_compiled_kernels_are_placed_below_the_root(zoo_run: ZooRun) -> None:
    _assert("placement", zoo_run)


def test_the_zoo_covers_what_issue_35_asks() -> None:
    """At least 15 families of every kind; checkpointing both ways on two families; three compiled
    models, one with a decorated forward. Trimming the zoo for speed fails here."""
    plain = [c for c in CASES if not c.checkpointed and not c.compiled]
    assert len({c.id.split("-")[0] for c in plain}) >= 15
    assert {c.kind for c in plain} >= {
        "decoder",
        "encoder",
        "encoder-decoder",
        "moe",
        "vision",
        "speech",
        "state-space",
    }
    checkpointed = {(c.id.split("-")[0], c.reentrant) for c in CASES if c.checkpointed}
    assert checkpointed == {(family, r) for family in ("llama", "gpt2") for r in (True, False)}
    compiled = [c.id for c in CASES if c.compiled]
    assert len(compiled) == 3 and any("decorated" in c for c in compiled)
