"""Human units: µs/ms/s, B/KiB/MiB/GiB, K/M/G/T FLOPs, counts, shares."""

from __future__ import annotations

import json


def fmt_time_us(us: float) -> str:
    """``812.4µs``, ``12.35ms``, ``3.210s``; empty for zero."""
    if us == 0:
        return ""
    a = abs(us)
    if a < 1000:
        return f"{us:.1f}µs"
    if a < 1_000_000:
        return f"{us / 1000:.2f}ms"
    return f"{us / 1_000_000:.3f}s"


def fmt_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``12.0 MiB``, ``3.21 GiB``, up to PiB (negative for net frees); empty for 0."""
    if n == 0:
        return ""
    a = abs(n)
    for unit, size in (
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ):
        if a >= size:
            value = n / size
            return f"{value:.2f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def fmt_si(n: float, suffix: str = "") -> str:
    """``1.23K``, ``4.56M``, ``7.89G``, ``1.2T`` (FLOPs, params); empty for zero."""
    if n == 0:
        return ""
    a = abs(n)
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if a >= size:
            return f"{n / size:.2f}{unit}{suffix}"
    return f"{int(n)}{suffix}"


def fmt_share(part: float, whole: float) -> str:
    """Percentage of ``whole``, one decimal; empty when ``whole`` is zero."""
    if whole <= 0:
        return ""
    return f"{100.0 * part / whole:.1f}%"


def fmt_shapes(shapes: str | None) -> str:
    """Recorded shapes (``[[5, 64, 56, 56], [5]]``) compact, torchinfo-like: ``5x64x56x56, 5``; a
    scalar is ``()``, text that is no list of shapes comes back as it is."""
    if not shapes:
        return ""
    try:
        parsed = json.loads(shapes)
    except ValueError:
        return shapes
    if not isinstance(parsed, list) or not all(isinstance(s, list) for s in parsed):
        return shapes
    return ", ".join("x".join(str(d) for d in s) if s else "()" for s in parsed)
