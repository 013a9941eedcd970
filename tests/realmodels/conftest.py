"""The zoo's one shared fixture: a case's runs, made once and shared by all its checks.

``test_zoo.py`` parametrizes ``case_id`` with module scope, case by case in order, so each case is
run once, checked, and released before the next is built (what is alive when a capture begins is
part of what the memory check compares).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.realmodels.models import BY_ID
from tests.realmodels.runs import ZooRun, run_case


@pytest.fixture(scope="module")
def zoo_run(case_id: str) -> Iterator[ZooRun]:
    """The runs of the zoo case ``case_id``."""
    case = BY_ID[case_id]
    run = run_case(case)
    yield run
    run.release()
    if case.compiled:
        torch._dynamo.reset()  # its graphs (and what they hold) go with it
