"""Answers before running: a step predicted on fake tensors (``ls.estimate``), the largest batch
that fits (``ls.max_batch_size``), what to checkpoint when it does not (``ls.fit``), and this
machine's CPU as a device spec (docs/estimate.md)."""

from layerscope.estimates.api import BatchSearch, estimate, max_batch_size, search_batch
from layerscope.estimates.checkpointing import checkpointed
from layerscope.estimates.cpu_spec import cpu_spec
from layerscope.estimates.fit import FitOption, FitPlan, fit

__all__ = [
    "BatchSearch",
    "FitOption",
    "FitPlan",
    "checkpointed",
    "cpu_spec",
    "estimate",
    "fit",
    "max_batch_size",
    "search_batch",
]
