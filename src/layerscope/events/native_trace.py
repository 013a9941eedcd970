"""Trace files through the native reader (``capture/native_trace.cpp``): the file's bytes fed to it in
blocks (``.json.gz`` inflated by a second thread while it parses), its columns made into the very
EventTable ``chrome.TraceTableBuilder`` makes.

The reader returns each distinct name, shapes list, concrete-inputs list and input-type list once, so
everything the Python path does per event with those (shapes strings, FLOP formulas, dtypes) is done
here per distinct value, and names are interned in the order the Python path interns them. When the
reader declines (a value of an unexpected type, a cut or damaged file, a saved profile) this returns
None and the caller reads the file with the Python path, which then behaves exactly as before.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from layerscope.events.chrome import FlopCounter
from layerscope.events.native_columns import Declined, table_from_columns
from layerscope.events.stream import Progress
from layerscope.events.table import EventTable

BLOCK_BYTES = 8 << 20

#: Why the last read declined (for tests and benchmarks); None after a native read.
last_decline: str | None = None


#: A block of the file's JSON and how far into the file (on disk) it reaches, for progress.
Block = tuple[bytes | memoryview, int]


def _blocks(path: Path) -> Iterator[Block]:
    """The file's bytes in blocks, inflated when gzip (detected by content, as ``stream.py`` does)."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not compressed:
            block = bytearray(BLOCK_BYTES)
            view = memoryview(block)
            while n := raw.readinto(block):
                yield view[:n], raw.tell()
            return
        inflate = zlib.decompressobj(31)
        while data := raw.read(BLOCK_BYTES // 4):
            while data:
                if inflate.eof:  # a file of several gzip members, as gzip.open reads them
                    inflate = zlib.decompressobj(31)
                yield inflate.decompress(data, BLOCK_BYTES), raw.tell()
                data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
        while not inflate.eof and (rest := inflate.decompress(b"", BLOCK_BYTES)):
            yield rest, raw.tell()  # output held back by the block limit
        if not inflate.eof:  # cut short: the Python path keeps what came before the damage
            raise Declined("gzip stream cut short")


def _overlapped(blocks: Iterator[Block]) -> Iterator[Block]:
    """``blocks`` made by a second thread, two ahead: inflating (zlib releases the GIL) runs while the
    reader parses (it releases the GIL too). Plain files need no thread: the reader's copy of each
    block's unfinished end is the only work besides parsing."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce() -> None:
        try:
            for block, position in blocks:
                if stop.is_set():
                    return
                ready.put((bytes(block), position))
            ready.put(None)
        except BaseException as exc:  # handed to the reading thread
            ready.put(exc)

    worker = threading.Thread(target=produce, name="layerscope-inflate", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                worker.join(0.01)


def read_native(
    path: Path, module: ModuleType, flops: FlopCounter | None, progress: Progress | None = None
) -> EventTable | None:
    """The trace at ``path`` read by the native reader, or None when it declines (see module doc)."""
    global last_decline
    try:
        with open(path, "rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
        size = path.stat().st_size
        # the span columns reserve room from the size (of the JSON: unknown for .gz)
        reader = module.TraceReader(flops is None, 0 if gz else size)
        blocks = _blocks(path)
        for block, position in _overlapped(blocks) if gz else blocks:
            reader.feed(block)
            if reader.declined():
                break
            if progress is not None:  # called from this thread only, as the Python path does
                progress(position, size)
        found = reader.finish()
        if isinstance(found, str):
            raise Declined(found)
        table = table_from_columns(found, flops, str(path))
    except (Declined, zlib.error, EOFError, OSError) as exc:
        last_decline = str(exc) or type(exc).__name__
        return None
    last_decline = None
    return table
