"""Reading profiler events (live Kineto results or Chrome trace files) into an :class:`EventTable`."""

from layerscope.events.table import EventKind, EventTable

__all__ = ["EventKind", "EventTable"]
