"""Reading big trace files in blocks: the ``traceEvents`` array is cut between events and parsed a
block at a time, so memory holds one block's Python objects, not the whole file's.

Kineto writes one event object after another (``},\\n  {``); the cutter looks for ``}``, optional
whitespace, ``,``, optional whitespace, ``{`` near the end of the buffer and verifies the cut by
parsing. A file that ends early (a killed job) keeps every complete event before the damage and says
how many bytes were lost. Files without a ``traceEvents`` key are parsed whole.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from layerscope.errors import TraceFormatError
from layerscope.events.chrome import TraceTableBuilder

BLOCK_BYTES = 16 << 20
_MARKER = b'"traceEvents"'
_WHITESPACE = b" \t\r\n"

#: progress(bytes read from disk, file size in bytes)
Progress = Callable[[int, int], None]


@dataclass
class StreamResult:
    """What the block reader saw besides the events."""

    header: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False
    lost_bytes: int = 0
    whole_document: Any = None  # set when the file had no traceEvents array to stream


def _skip_space(buf: bytes, i: int, step: int) -> int:
    while 0 <= i < len(buf) and buf[i] in _WHITESPACE:
        i += step
    return i


def _boundaries(buf: bytes, limit: int = 8) -> list[tuple[int, int]]:
    """Up to ``limit`` cut points from the end: (end of an event, start of the next one)."""
    found: list[tuple[int, int]] = []
    end = len(buf)
    while len(found) < limit:
        close = buf.rfind(b"}", 0, end)
        if close < 0:
            break
        j = _skip_space(buf, close + 1, 1)
        if j < len(buf) and buf[j : j + 1] == b",":
            k = _skip_space(buf, j + 1, 1)
            if k < len(buf) and buf[k : k + 1] == b"{":
                found.append((close + 1, k))
        end = close
    return found


def _parse_events(piece: bytes) -> list[Any] | None:
    try:
        value = orjson.loads(b"[" + piece + b"]")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def _parse_object(piece: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(piece)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _Source:
    """Bytes of a .json or .json.gz file, block by block, with the on-disk position for progress."""

    def __init__(self, path: Path) -> None:
        from layerscope.model.serialize import open_binary

        self.raw: IO[bytes] = open_binary(path)
        self.size = os.fstat(self.raw.fileno()).st_size
        compressed = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        self.stream: IO[bytes] = gzip.GzipFile(fileobj=self.raw) if compressed else self.raw  # type: ignore[assignment]
        self.damaged = False

    def read(self, n: int) -> bytes:
        if self.damaged:
            return b""
        pieces: list[bytes] = []
        size = 0
        try:
            # read1 in small steps: when a gzip stream is cut short, only the last step is lost
            while size < n:
                piece = self.stream.read1(min(n - size, 1 << 20))  # type: ignore[attr-defined]
                if not piece:
                    break
                pieces.append(piece)
                size += len(piece)
        except (EOFError, OSError, zlib.error):
            self.damaged = True  # a gzip stream cut short or corrupt: what came before still counts
        return b"".join(pieces)

    @property
    def position(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()


def stream_trace(
    path: Path, builder: TraceTableBuilder, progress: Progress | None = None, block_bytes: int = BLOCK_BYTES
) -> StreamResult:
    """Feed every event of the trace at ``path`` to ``builder``; returns the header and damage."""
    source = _Source(path)
    try:
        return _stream(source, builder, progress, block_bytes)
    finally:
        source.close()


def _stream(
    source: _Source, builder: TraceTableBuilder, progress: Progress | None, block_bytes: int
) -> StreamResult:
    result = StreamResult()
    buf = b""
    # Header: everything up to the events array.
    while True:
        found = buf.find(_MARKER)
        bracket = buf.find(b"[", found) if found >= 0 else -1
        if bracket >= 0:
            break
        block = source.read(block_bytes)
        if not block:
            return _whole_document(buf, result, source)
        buf += block
    result.header = _parse_object(buf[:found].rstrip(_WHITESPACE).rstrip(b",") + b"}")
    rest = buf[bracket + 1 :]
    while True:
        block = source.read(block_bytes)
        if progress is not None:
            progress(source.position, source.size)
        if not block:
            break
        rest += block
        for end, start in _boundaries(rest):
            events = _parse_events(rest[:end])
            if events is not None:
                builder.add_events(events)
                rest = rest[start:]
                break
        if len(rest) > 64 * block_bytes:
            raise TraceFormatError("cannot split the traceEvents array into events (unusual formatting)")
    _finish(rest, builder, result)
    result.truncated = result.truncated or source.damaged
    return result


def _finish(rest: bytes, builder: TraceTableBuilder, result: StreamResult) -> None:
    """The last events, the array's end and the keys after it; or, for a cut file, what survives."""
    end = len(rest)
    for _ in range(64):  # the closing ] of traceEvents is among the last few ] of the file
        close = rest.rfind(b"]", 0, end)
        if close < 0:
            break
        events = _parse_events(rest[:close])
        if events is not None:
            builder.add_events(events)
            trailer = rest[close + 1 :].strip(_WHITESPACE).lstrip(b",")
            result.header.update(_parse_object(b"{" + trailer) if trailer.strip(_WHITESPACE) != b"}" else {})
            return
        end = close
    result.truncated = True
    for cut, _ in _boundaries(rest, limit=64):
        events = _parse_events(rest[:cut])
        if events is not None:
            builder.add_events(events)
            result.lost_bytes = len(rest) - cut
            return
    whole = _parse_events(rest.strip(_WHITESPACE).rstrip(b","))
    if whole is not None:
        builder.add_events(whole)
        return
    result.lost_bytes = len(rest)


def _whole_document(buf: bytes, result: StreamResult, source: _Source) -> StreamResult:
    """No traceEvents array found: the file is something else (a bare array, a profile, junk)."""
    if source.damaged and not buf:
        raise TraceFormatError("corrupt gzip data")
    if not buf.strip():
        raise TraceFormatError("empty file")
    try:
        result.whole_document = orjson.loads(buf)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON ({exc})") from None
    return result
