"""Shared fixtures: deterministic seeds, real trace discovery, golden-file comparison."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files from current output")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def real_traces() -> Path:
    """The folder of real third-party traces (LAYERSCOPE_REAL_TRACES or ../shared/traces)."""
    folder = Path(os.environ.get("LAYERSCOPE_REAL_TRACES", ROOT.parent / "shared" / "traces"))
    if not folder.is_dir():
        pytest.skip(f"real traces not found at {folder} (set LAYERSCOPE_REAL_TRACES)")
    return folder


@pytest.fixture
def golden(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """compare(name, text): the text must equal tests/golden/<name> (rewritten with --update-goldens)."""
    update = request.config.getoption("--update-goldens")

    def compare(name: str, text: str) -> None:
        path = GOLDEN / name
        if update or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if not update:
                pytest.fail(f"golden {name} did not exist; written now, check it and re-run")
        assert text == path.read_text(), f"output differs from golden {name} (--update-goldens to accept)"

    return compare
