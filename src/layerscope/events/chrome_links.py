"""What a Chrome trace's events say about each other, read once the trace's events are in a table:
module ranges from ``with_stack``'s ``nn.Module`` Python events, and each backward span's forward
thread from the ``fwdbwd`` flows (``chrome.py`` calls both when a table is finished)."""

from __future__ import annotations

from typing import Any

from layerscope.events import names as event_names
from layerscope.events.table import EventKind, EventTable


def module_ranges_from_python_events(table: EventTable, python_ids: dict[int, tuple[Any, Any]]) -> None:
    """Traces recorded with ``with_stack`` carry ``nn.Module: Linear_0`` Python events. Without
    layerscope's own ranges, they become module ranges, named by their chain of module events
    (``Sequential_0.Linear_1``: torch records class and instance index, not attribute names)."""
    if any(name.startswith(event_names.MODULE_RANGE_PREFIX) for name in table.names):
        return
    names = table.names
    by_python_id: dict[Any, int] = {pid: i for i, (pid, _) in python_ids.items() if pid is not None}
    label: dict[int, str] = {}
    for i in python_ids:
        found = event_names.nn_module_event_label(names[table.span_name[i]])
        if found is not None:
            label[i] = found
    if not label:
        return
    for i, own in label.items():
        chain = [own]
        parent = python_ids[i][1]
        seen = 0
        while parent is not None and parent in by_python_id and seen < 10_000:
            j = by_python_id[parent]
            if j in label:
                chain.append(label[j])
            parent = python_ids[j][1]
            seen += 1
        type_name = own.rsplit("_", 1)[0] if own.rsplit("_", 1)[-1].isdigit() else own
        table.span_name[i] = table.intern(event_names.module_range_name(".".join(reversed(chain)), type_name))
        table.span_kind[i] = int(EventKind.USER_ANNOTATION)


def resolve_forward_threads(
    table: EventTable,
    raw: list[int],
    span_at: dict[tuple[int, int], int],
    flow_starts: dict[Any, tuple[int, int]],
    flow_ends: dict[Any, tuple[int, int]],
) -> list[int]:
    """Backward spans name their forward thread by Kineto's internal id; map it to our tid."""
    mapping: dict[int, int] = {}
    for flow_id, start in flow_starts.items():
        end = flow_ends.get(flow_id)
        if end is None:
            continue
        fwd_span, bwd_span = span_at.get(start), span_at.get(end)
        if fwd_span is None or bwd_span is None or raw[bwd_span] == 0:
            continue
        mapping.setdefault(raw[bwd_span], table.span_tid[fwd_span])
    forward_threads = {
        table.span_tid[i]
        for i, (seq, f) in enumerate(zip(table.span_seq, raw, strict=True))
        if seq >= 0 and f == 0 and table.span_kind[i] == EventKind.CPU_OP
    }
    only = next(iter(forward_threads)) if len(forward_threads) == 1 else 0
    return [0 if f == 0 else mapping.get(f, only or -1) for f in raw]
