"""A drop-in for torchprof (which fails on current torch): ``from layerscope.compat import torchprof``.

Keeps torchprof's API and output layout::

    with torchprof.Profile(model, use_cuda=False, profile_memory=False, paths=None) as prof:
        model(x)
    print(prof.display(show_events=False))
    traces, event_lists = prof.raw()

Differences, on purpose: numbers come from layerscope's attribution (forward only by default, as
torchprof; ``backward=True`` adds the backward pass, which torchprof never had), and ``raw()``'s
per-path event list holds one list of events aggregated over all calls rather than one per call.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from torch import nn

from layerscope.model.metrics import Metrics
from layerscope.model.profile import OpStats, Phase
from layerscope.model.profile import Profile as LsProfile
from layerscope.units import fmt_bytes

#: torchprof's trace record: the module's path (a tuple starting with the root's class name),
#: whether it is a leaf, and the module itself.
Trace = namedtuple("Trace", ["path", "leaf", "module"])

#: One aggregated op of a module, with torchprof's FunctionEvent-like attribute names (µs, bytes).
Event = namedtuple(
    "Event",
    [
        "name",
        "count",
        "self_cpu_time_total",
        "cpu_time_total",
        "self_cuda_time_total",
        "cuda_time_total",
        "self_cpu_memory_usage",
        "cpu_memory_usage",
        "self_cuda_memory_usage",
        "cuda_memory_usage",
        "input_shapes",
    ],
)

_HEADERS = (
    "Module",
    "Self CPU total",
    "CPU total",
    "Self CUDA total",
    "CUDA total",
    "Self CPU Mem",
    "CPU Mem",
    "Self CUDA Mem",
    "CUDA Mem",
    "Number of Calls",
)


def _fmt_time(us: float) -> str:
    # torchprof printed torch's format_time: "1.671ms", "62.430us", "2.000s"
    if us == 0:
        return ""
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


class Profile:
    """torchprof.Profile: profile ``model`` layer by layer inside a ``with`` block."""

    def __init__(
        self,
        model: nn.Module,
        enabled: bool = True,
        use_cuda: bool = False,
        profile_memory: bool = False,
        paths: Iterable[Sequence[str]] | None = None,
        backward: bool = False,
    ) -> None:
        self._model = model
        self.enabled = enabled
        self.use_cuda = use_cuda
        self.profile_memory = profile_memory
        self.paths = [tuple(p) for p in paths] if paths is not None else None
        self.backward = backward
        self.exited = False
        self.traces: list[Trace] = []
        self.trace_profile_events: dict[tuple[str, ...], list[list[Event]]] = {}
        self._session: Any = None
        self._profile: LsProfile | None = None

    # ----- context manager -------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        if not self.enabled:
            return self
        if self.exited:
            raise RuntimeError("torchprof profiler can only be used once")
        import layerscope as ls

        root = type(self._model).__name__
        dotted = None
        if self.paths is not None:
            # torchprof paths start with the root's class name: ("AlexNet", "features", "3")
            dotted = [".".join(p[1:]) for p in self.paths if p and p[0] == root]
        activities = ["cpu", "cuda"] if self.use_cuda else ["cpu"]
        self._session = ls.profile(
            self._model, activities=activities, memory=self.profile_memory, paths=dotted
        )
        self._session.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.enabled or self._session is None:
            return
        self._session.stop()
        self.exited = True
        self._profile = self._session.profile
        self._collect()

    def __str__(self) -> str:
        return self.display()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    # ----- results -----------------------------------------------------------------------------------
    def _phases(self) -> tuple[Phase, ...]:
        return (Phase.FORWARD, Phase.BACKWARD) if self.backward else (Phase.FORWARD,)

    def _collect(self) -> None:
        assert self._profile is not None
        root = type(self._model).__name__
        rows_by_module: dict[str, list[OpStats]] = {}
        for row in self._profile.ops(group_by=("name", "module", "phase"), sort_by="self_cpu_us"):
            if row.module is not None and row.phase in self._phases():
                rows_by_module.setdefault(row.module, []).append(row)
        self.traces = []
        self.trace_profile_events = {}
        kept = {node.path for node in self._profile.modules()}
        for name, module in self._model.named_modules():
            path = (root, *name.split(".")) if name else (root,)
            leaf = len(list(module.children())) == 0
            self.traces.append(Trace(path, leaf, module))
            if name in kept:
                events = [self._event(r) for r in rows_by_module.get(name, [])]
                self.trace_profile_events[path] = [events] if events else []

    @staticmethod
    def _event(row: OpStats) -> Event:
        m = row.metrics
        return Event(
            row.name,
            row.calls,
            m.self_cpu_us,
            m.cpu_us,
            m.self_device_us,
            m.device_us,
            m.self_cpu_alloc_bytes,
            m.cpu_alloc_bytes,
            m.self_device_alloc_bytes,
            m.device_alloc_bytes,
            row.input_shapes,
        )

    def raw(self) -> tuple[list[Trace], dict[tuple[str, ...], list[list[Event]]]]:
        """``(traces, trace_profile_events)`` as torchprof returned them."""
        return self.traces, self.trace_profile_events

    @property
    def profile(self) -> LsProfile:
        """The full layerscope Profile behind this view."""
        if self._profile is None:
            raise RuntimeError("the profile exists after the `with` block")
        return self._profile

    def display(self, show_events: bool = False) -> str:
        """torchprof's table: the module tree (leaf modules carry the numbers unless ``paths``
        selected other modules), with each module's ops below it when ``show_events``."""
        if not self.exited or self._profile is None:
            return "<unfinished torchprof.profile>"
        nodes = {node.path: node for node in self._profile.modules()}
        selected = None if self.paths is None else {".".join(p[1:]) for p in self.paths}
        rows: list[tuple[str, ...]] = []
        root = type(self._model).__name__

        def metrics_of(path: str) -> tuple[Metrics, int] | None:
            node = nodes.get(path)
            if node is None:
                return None
            m = node.forward.merged(node.backward) if self.backward else node.forward
            return m, node.calls

        def walk(module: nn.Module, path: str, label: str) -> None:
            children = list(module.named_children())
            show_numbers = (not children) if selected is None else path in selected
            cells: tuple[str, ...] = (label,) + ("",) * 9
            found = metrics_of(path) if show_numbers else None
            if found is not None:
                m, calls = found
                cells = (
                    label,
                    _fmt_time(m.self_cpu_us),
                    _fmt_time(m.cpu_us),
                    _fmt_time(m.self_device_us),
                    _fmt_time(m.device_us),
                    fmt_bytes(m.self_cpu_alloc_bytes),
                    fmt_bytes(m.cpu_alloc_bytes),
                    fmt_bytes(m.self_device_alloc_bytes),
                    fmt_bytes(m.device_alloc_bytes),
                    str(calls),
                )
            rows.append(cells)
            if show_events and found is not None:
                key = (root, *path.split(".")) if path else (root,)
                for event in (self.trace_profile_events.get(key) or [[]])[0]:
                    rows.append(
                        (
                            f"{_indent(label)}{event.name}",
                            _fmt_time(event.self_cpu_time_total),
                            _fmt_time(event.cpu_time_total),
                            _fmt_time(event.self_cuda_time_total),
                            _fmt_time(event.cuda_time_total),
                            fmt_bytes(event.self_cpu_memory_usage),
                            fmt_bytes(event.cpu_memory_usage),
                            fmt_bytes(event.self_cuda_memory_usage),
                            fmt_bytes(event.cuda_memory_usage),
                            str(event.count),
                        )
                    )
            for k, (name, child) in enumerate(children):
                last = k == len(children) - 1
                prefix = _child_prefix(label)
                walk(child, f"{path}.{name}" if path else name, f"{prefix}{'└── ' if last else '├── '}{name}")

        walk(self._model, "", root)
        widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(_HEADERS)]
        lines = [" | ".join(h.ljust(widths[k]) for k, h in enumerate(_HEADERS)).rstrip()]
        lines.append("-|-".join("-" * w for w in widths))
        lines += [" | ".join(c.ljust(widths[k]) for k, c in enumerate(r)).rstrip() for r in rows]
        return "\n".join(lines) + "\n"


def _child_prefix(label: str) -> str:
    """torchprof's compact guides: a child of ``├── x`` is drawn ``│├── y``, of ``└── x`` as `` ├── y``."""
    stripped = label.lstrip("│ ")
    guides = label[: len(label) - len(stripped)]
    if stripped.startswith("├── "):
        return guides + "│"
    if stripped.startswith("└── "):
        return guides + " "
    return guides


def _indent(label: str) -> str:
    return _child_prefix(label) + "    "


__all__ = ["Event", "Profile", "Trace"]
