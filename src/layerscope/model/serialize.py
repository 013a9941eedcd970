"""Saving and loading Profiles: JSON (optionally gzipped), versioned, compact.

Metrics are stored as lists in ``Metrics`` field order (named once in ``metric_fields``); op rows are
columnar with a string table, because they are the bulk of a saved profile.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from layerscope.errors import TraceFormatError
from layerscope.model.memory import relative_totals
from layerscope.model.meta import SCHEMA_VERSION
from layerscope.model.meta_json import meta_from_json, meta_to_json
from layerscope.model.metrics import FIELD_NAMES, RENAMED_FIELDS, Metrics
from layerscope.model.profile import (
    ModuleNode,
    OpStats,
    Phase,
    Profile,
    StepStats,
    UnattributedEntry,
)

FORMAT_TAG = "layerscope.profile"
#: The schema versions a saved profile may have: 1 (a flat meta dict) and 2 (typed records).
READABLE_VERSIONS = (1, SCHEMA_VERSION)


class StringTable:
    """Interns strings for columnar JSON: ``table.id(name)`` is the name's index in ``table.strings``
    (-1 for None), so repeated module and op names are stored once."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def id(self, value: str | None) -> int:
        """The index of ``value`` (added on first sight), or -1 for None."""
        if value is None:
            return -1
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self._ids)
        return found

    @property
    def strings(self) -> list[str]:
        """Every string, in index order."""
        return list(self._ids)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The JSON-ready dict form of a profile."""
    table = StringTable()
    sid = table.id

    rows = profile.op_rows
    ops = {
        "name": [sid(r.name) for r in rows],
        "phase": [r.phase.value if r.phase is not None else None for r in rows],
        "module": [sid(r.module) for r in rows],
        "input_shapes": [sid(r.input_shapes) for r in rows],
        "scope": [sid(r.scope) for r in rows],
        "calls": [r.calls for r in rows],
        "metrics": [r.metrics.to_list() for r in rows],
    }
    # Python stacks (with_stack): each distinct stack once, as string ids; rows point at them.
    stack_ids: dict[tuple[str, ...], int] = {}
    if profile.has_stacks:
        ops["stack"] = [stack_ids.setdefault(r.stack, len(stack_ids)) if r.stack else -1 for r in rows]
    if any(r.bytes is not None or r.dtype is not None for r in rows):  # older profiles: absent
        ops["bytes"] = [r.bytes for r in rows]
        ops["dtype"] = [sid(r.dtype) for r in rows]
    result = {
        "format": FORMAT_TAG,
        "schema_version": SCHEMA_VERSION,
        "metric_fields": list(FIELD_NAMES),
        "meta": meta_to_json(profile.meta),
        "totals": profile.totals.to_list(),
        "root": _node_to_dict(profile.root),
        "unattributed": [
            [e.label, e.phase.value, e.calls, e.metrics.to_list()] for e in profile.unattributed
        ],
        "steps": [
            {
                "step": s.step,
                "wall_us": s.wall_us,
                "device_us": s.device_us,
                "cpu_us": s.cpu_us,
                "modules": {k: list(v) for k, v in s.modules.items()},
                "unattributed": s.unattributed,
                **{
                    name: getattr(s, name)
                    for name in ("absolute_peak_bytes", "alloc_bytes", "net_bytes")
                    if getattr(s, name) is not None
                },
            }
            for s in profile.steps
        ],
        "strings": [],
        "ops": ops,
    }
    if stack_ids:
        result["stacks"] = [[sid(frame) for frame in stack] for stack in stack_ids]
    result["strings"] = table.strings  # last: the stacks above add strings
    return result


def _node_to_dict(node: ModuleNode) -> dict[str, Any]:
    return {
        "path": node.path,
        "type": node.type_name,
        "calls": node.calls,
        "params": node.params,
        "params_total": node.params_total,
        "in": node.input_shapes,
        "out": node.output_shapes,
        "fwd": node.forward.to_list(),
        "bwd": node.backward.to_list(),
        "children": [_node_to_dict(c) for c in node.children],
        **({"src": node.source} if node.source else {}),
        **({"recompute_calls": node.recompute_calls} if node.recompute_calls else {}),
    }


def profile_from_dict(data: Any) -> Profile:
    """Inverse of :func:`profile_to_dict`; TraceFormatError on anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT_TAG:
        raise TraceFormatError("not a layerscope profile (no 'format: layerscope.profile' field)")
    version = data.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise TraceFormatError(
            f"profile schema version {version!r} is not supported "
            f"(this layerscope reads versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    saved_fields = data.get("metric_fields")
    old_names = isinstance(saved_fields, list) and any(f in RENAMED_FIELDS for f in saved_fields)
    if old_names and isinstance(saved_fields, list):  # saved before the memory names were fixed (0.2)
        saved_fields = [RENAMED_FIELDS.get(f, f) for f in saved_fields]
    if saved_fields != list(FIELD_NAMES):
        raise TraceFormatError("profile metric fields differ from this layerscope's")
    try:
        strings: list[str] = data["strings"]
        rows = _op_rows_from_dict(data["ops"], strings, data.get("stacks", []))
        meta = meta_from_json(data["meta"], version)
        totals = Metrics.from_list(data["totals"])
        return Profile(
            meta=meta,
            root=_node_from_dict(data["root"]),
            op_rows=rows,
            unattributed=tuple(
                UnattributedEntry(label, Phase(phase), calls, Metrics.from_list(m))
                for label, phase, calls, m in data["unattributed"]
            ),
            # 0.2 kept the block's absolute peaks in the totals; they are relative now
            totals=relative_totals(totals, meta.memory) if old_names else totals,
            steps=tuple(
                StepStats(
                    step=s["step"],
                    wall_us=s["wall_us"],
                    device_us=s["device_us"],
                    cpu_us=s["cpu_us"],
                    modules={k: (v[0], v[1]) for k, v in s["modules"].items()},
                    unattributed=s["unattributed"],
                    absolute_peak_bytes=s.get("absolute_peak_bytes", s.get("peak_bytes")),
                    alloc_bytes=s.get("alloc_bytes"),
                    net_bytes=s.get("net_bytes"),
                )
                for s in data["steps"]
            ),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise TraceFormatError(f"damaged layerscope profile: {type(exc).__name__}: {exc}") from None


def _op_rows_from_dict(
    ops: dict[str, Any], strings: list[str], saved_stacks: list[Any]
) -> tuple[OpStats, ...]:
    """The op rows of a saved profile (columns; ``bytes`` and ``dtype`` absent before 0.3)."""

    def text(i: int) -> str | None:
        return None if i < 0 else strings[i]

    stacks = [tuple(strings[f] for f in stack) for stack in saved_stacks]
    stack_of_row = ops.get("stack") or [-1] * len(ops["name"])
    bytes_of_row = ops.get("bytes") or [None] * len(ops["name"])
    dtype_of_row = ops.get("dtype") or [-1] * len(ops["name"])
    return tuple(
        OpStats(
            name=strings[n],
            phase=Phase(ph) if ph is not None else None,
            module=text(m),
            input_shapes=text(s),
            calls=c,
            metrics=Metrics.from_list(mv),
            scope=text(sc) or "",
            stack=stacks[st] if st >= 0 else (),
            bytes=nb,
            dtype=text(dt),
        )
        for n, ph, m, s, sc, c, mv, st, nb, dt in zip(
            ops["name"],
            ops["phase"],
            ops["module"],
            ops["input_shapes"],
            ops["scope"],
            ops["calls"],
            ops["metrics"],
            stack_of_row,
            bytes_of_row,
            dtype_of_row,
            strict=True,
        )
    )


def _node_from_dict(d: dict[str, Any]) -> ModuleNode:
    return ModuleNode(
        path=d["path"],
        type_name=d["type"],
        calls=d["calls"],
        params=d["params"],
        params_total=d["params_total"],
        input_shapes=d["in"],
        output_shapes=d["out"],
        forward=Metrics.from_list(d["fwd"]),
        backward=Metrics.from_list(d["bwd"]),
        children=tuple(_node_from_dict(c) for c in d["children"]),
        source=d.get("src"),
        recompute_calls=d.get("recompute_calls", 0),
    )


def write_atomic(path: Path, payload: bytes) -> Path:
    """Write bytes to ``path`` through a temp file in the same folder and a rename: a reader never
    sees a half-written file, and a failure leaves no partial output. The file gets the mode a plain
    ``open(path, "wb")`` would give it: a new file's follows the umask, a replaced file keeps its own."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = _new_temp_file(folder, path.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            _keep_mode_of(path, handle.fileno())
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def _new_temp_file(folder: Path, name: str) -> tuple[int, str]:
    """A new file beside ``name``, created as ``open()`` creates files (mode 0666 less the umask),
    where ``tempfile.mkstemp`` would make it 0600 and every report private."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = str(folder / f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue
    raise FileExistsError(f"no free temporary name beside {folder / name}")


def _keep_mode_of(path: Path, fd: int) -> None:
    """An existing regular file keeps its permissions when replaced, as it would under ``open()``."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) and hasattr(os, "fchmod"):
        os.fchmod(fd, stat.S_IMODE(st.st_mode))


def encode_json(path: Path, data: Any) -> bytes:
    """``data`` as the bytes of a JSON file at ``path``: gzipped when the name ends in ``.gz``."""
    payload = orjson.dumps(data)
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6)
    return payload


def write_json(path: Path, data: Any) -> Path:
    """``data`` as JSON at ``path``, gzipped when the name ends in ``.gz``, written atomically."""
    return write_atomic(path, encode_json(path, data))


def read_json(path: Path) -> Any:
    """A whole ``.json`` or ``.json.gz`` document (gzip detected by content), or TraceFormatError
    with a one-line reason. For big traces use ``events.stream``, which reads in blocks."""
    with open_binary(path) as source:
        raw = source.read()
    try:
        return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, orjson.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON document ({exc})") from None


def save_profile(profile: Profile, path: Path) -> Path:
    """Save as JSON, gzipped when the name ends in ``.gz``."""
    return write_json(path, profile_to_dict(profile))


def open_binary(path: Path) -> BinaryIO:
    """``path`` opened for reading, or TraceFormatError with a one-line reason."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a folder, not a file") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror}") from None
