"""Hugging Face Accelerate: layerscope driven by Accelerate's ``ProfileKwargs``.

    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(activities=["cpu"], schedule_option=...,
                                                             output_trace_dir="trace")])
    with layerscope.integrations.accelerate.profile(accelerator, model) as prof:
        for batch in loader:
            ...
            prof.step()

Fields used: ``activities``, ``schedule_option``, ``record_shapes``, ``profile_memory``,
``with_flops``, ``with_stack``, ``output_trace_dir`` (each cycle's profile, text report and Chrome
trace, with the process index in the names, as Accelerate writes one trace per process); the
files written are in ``prof.on_trace_ready.written``, and the main process says on stderr, one line
per cycle, which files it wrote where.
"""

from __future__ import annotations

from typing import Any

from layerscope.errors import UsageError
from layerscope.handlers import current_rank
from layerscope.integrations._common import save_with_report


def _profile_kwargs(source: Any) -> tuple[Any, int]:
    """The ProfileKwargs and this process's rank (the Accelerator's process index, else the
    environment's: every process given the same ProfileKwargs must still write its own files)."""
    from accelerate.utils import ProfileKwargs

    if isinstance(source, ProfileKwargs):
        return source, current_rank()
    handler = getattr(source, "profile_handler", None)
    if handler is None and hasattr(source, "process_index"):
        handler = ProfileKwargs()  # an Accelerator without ProfileKwargs: Accelerate's defaults
    if handler is None:
        raise UsageError("pass an accelerate.Accelerator or accelerate.utils.ProfileKwargs")
    return handler, int(getattr(source, "process_index", 0))


def profile(source: Any, model: Any = None, *, trace: bool = True, depth: int | None = None) -> Any:
    """A ``layerscope.profile`` configured from an Accelerator's (or a ProfileKwargs') settings."""
    import layerscope as ls

    kwargs, rank = _profile_kwargs(source)
    activities = [str(a).lower() for a in (kwargs.activities or ["cpu"])]
    schedule = None
    option = kwargs.schedule_option
    if option:
        allowed = {"wait", "warmup", "active", "repeat", "skip_first"}
        schedule = ls.schedule(**{k: int(v) for k, v in option.items() if k in allowed})
    handler = None
    if kwargs.output_trace_dir:
        # every process writes its files; the main process says where they went
        handler = save_with_report(kwargs.output_trace_dir, trace=trace, rank=rank, announce=rank == 0)
    session = ls.profile(
        model,
        activities=activities,
        memory=bool(kwargs.profile_memory),
        shapes=bool(kwargs.record_shapes) or bool(kwargs.with_flops),
        flops=bool(kwargs.with_flops) or bool(kwargs.record_shapes),
        with_stack=bool(kwargs.with_stack),
        depth=depth,
        schedule=schedule,
        on_trace_ready=handler,
    )
    return session


def flight_recorder(
    source: Any, model: Any = None, *, keep: int = 100, detail_every: int = 0, slow: float | None = 3.0
) -> Any:
    """``ls.flight_recorder`` for an Accelerate job: dumps into the ProfileKwargs'
    ``output_trace_dir`` (else ``./flight``), the rank in their names under torch.distributed. Use it
    as a context manager around the loop and call ``step()`` per step."""
    import layerscope as ls

    kwargs, _ = _profile_kwargs(source)
    out = kwargs.output_trace_dir or "flight"
    return ls.flight_recorder(model, keep=keep, detail_every=detail_every, out=out, slow=slow)
