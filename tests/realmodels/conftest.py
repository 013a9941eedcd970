"""The zoo's one shared fixture: a case's runs, made once and shared by all its checks.

``test_zoo.py`` parametrizes ``case_id`` with module scope, case by case in order, so each case is
run once, checked, and released before the next is built (what is alive when a capture begins is
part of what the memory check compares).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from tests.realmodels.runs import ZooRun


def why_no_zoo() -> str | None:
    """Why the zoo cannot run here (None: it can): the pinned transformers needs Python 3.11 and
    torch 2.6 or newer (``make compat`` runs the suite on older torch)."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed"
    from transformers.utils.import_utils import is_torch_available

    if not is_torch_available():
        return f"transformers does not work with torch {torch.__version__}"
    return None


@pytest.fixture(scope="module")
def zoo_run(case_id: str) -> Iterator[ZooRun]:
    """The runs of the zoo case ``case_id``."""
    from tests.realmodels.models import BY_ID
    from tests.realmodels.runs import run_case

    case = BY_ID[case_id]
    run = run_case(case)
    yield run
    run.release()
    if case.compiled:
        torch._dynamo.reset()  # its graphs (and what they hold) go with it
