"""Memory attribution, one package for every mechanism that turns memory events into figures.

* ``sums.py``: each memory event to its owner span; allocated and net bytes per bucket and per span;
  relative peaks over windows (sparse-table range maxima).
* ``windows.py``: the windows whose relative peaks become each bucket's peak.
* ``story.py``: events of one device class paired into allocations by address, named after the
  memory watch's snapshots, with the baseline (what was live before the block).
* ``report.py``: the :class:`~layerscope.model.memory.MemoryReport` (``meta.memory``): absolute
  peaks, live at the peak, per-step figures, saved for backward, out of memory.
* ``timeline.py``: the :class:`~layerscope.model.memory.MemoryTimeline` (``meta.memory_timeline``).

The records live in the model layer (``model/memory.py``), so that loading and rendering a saved
profile never imports attribution.
"""
