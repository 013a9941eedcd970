"""Answers before running: a step predicted on fake tensors (``ls.estimate``), the largest batch
that fits (``ls.max_batch_size``), and this machine's CPU as a device spec (docs/estimate.md)."""

from layerscope.estimates.api import BatchSearch, estimate, max_batch_size, search_batch
from layerscope.estimates.cpu_spec import cpu_spec

__all__ = ["BatchSearch", "cpu_spec", "estimate", "max_batch_size", "search_batch"]
