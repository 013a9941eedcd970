"""The native trace reader's fast paths against the Python path: times read from their digits
(microseconds with at most three decimals, below 2**43) without parsing a double, integers
accumulated while scanned, strings scanned sixteen bytes at a time, FLOPs per call numbered by the
reader, and the name table's order found from first uses. Each must give the EventTable the Python
path gives, on the values at the edges of each path."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_native_trace import assert_same, reader  # noqa: F401  (the fixture)

# times at the edges of the digits path (<= 3 decimals, whole part below 2**43) and beyond it
TIMES = [
    "0", "0.0", "-0.0", "1", "1.5", "12.25", "12.125", "-3.125", "-3.5", "0.001", "0.0005", "1.0005",
    "999999.9995", "2.675", "1000000.000", "8796093022207.999", "8796093022208.001",
    "8796093022207.9995", "4398046511104.123", "1234567890123.456", "1e3", "1.5E-3", "2.5e+2",
    "-0.001", "123456789012345678", "-123456789012345678",
]  # fmt: skip


def _trace_text(times: list[str], names: list[str] | None = None) -> str:
    """A trace whose spans have these times (as written, digits untouched) and names."""
    events = []
    for k, ts in enumerate(times):
        name = json.dumps(names[k % len(names)] if names else f"op{k % 7}")
        events.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": {name}, "pid": 1, "tid": {1 + k % 2}, '
            f'"ts": {ts}, "dur": {times[-1 - k]}, "args": {{"External id": {k}, "Sequence number": {k}}}}}'
        )
    return '{"traceEvents": [\n' + ",\n".join(events) + "\n]}"


def test_times_at_the_edges_read_identically(reader: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "times.json"
    for ts in TIMES:  # one at a time: a time the reader declines must not hide the others
        path.write_text(_trace_text([ts, "1.5", "2"]))
        huge = ts.lstrip("-").isdigit() and len(ts.lstrip("-")) > 16  # out of range: reported by Python
        assert_same(path, declines=huge)
    path.write_text(_trace_text(TIMES[:-2]))  # all together, the huge ones aside (out of range)
    assert_same(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**44), 2**44),
            st.integers(0, 9999),
            st.integers(0, 5),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_random_decimal_times_read_identically(
    reader: ModuleType,  # noqa: F811
    tmp_path: Path,
    parts: list[tuple[int, int, int]],
) -> None:
    """Whole part, fraction digits and how many of them: both sides of 2**43 and of 3 decimals."""
    times = []
    for whole, fraction, digits in parts:
        text = str(whole) + (f".{fraction:04d}"[: digits + 1] if digits else "")
        times.append(text)
    path = tmp_path / "random_times.json"
    path.write_text(_trace_text(times))
    assert_same(path)


def test_long_non_ascii_and_escaped_names(reader: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    """Names that cross the sixteen-byte steps at every offset, with a quote, a backslash, a
    non-ASCII character or an escape at each place."""
    names = []
    for length in range(0, 40):
        for special in ('"', "\\", "é", "\u2603", "\n", "\U0001f600"):
            names.append("k" * length + special + "x" * (39 - length))
    path = tmp_path / "names.json"
    path.write_text(_trace_text(["1.5"] * len(names), names))
    assert_same(path)


@pytest.mark.parametrize("repeat", [1, 3])
def test_flops_per_call_and_name_order(reader: ModuleType, tmp_path: Path, repeat: int) -> None:  # noqa: F811
    """Ops whose (name, shapes, concrete inputs) repeat in mixed order: FLOPs per distinct call, and
    names, shapes and dtypes interned in the order the Python path meets them."""
    calls = [
        ("aten::mm", [[4, 8], [8, 16]], None, ["float", "float"]),
        (
            "aten::addmm",
            [[16], [4, 8], [8, 16], [], []],
            ["", "", "", "2", "1"],
            ["float"] * 3 + ["Scalar"] * 2,
        ),
        ("aten::addmm", [[16], [4, 8], [8, 16], [], []], ["", "", "", "1", "1"], ["c10::BFloat16"] * 3),
        ("aten::mm", [[8, 8], [8, 8]], None, ["c10::Half", "c10::Half"]),
        ("aten::relu", [[4, 8]], None, ["float"]),
        ("aten::mm", [[4, 8], [8, 16]], None, ["double", "double"]),
    ]
    events = []
    order = [0, 1, 2, 0, 3, 4, 1, 5, 2, 3] * repeat
    for k, which in enumerate(order):
        name, dims, concrete, types = calls[which]
        args: dict[str, object] = {"Input Dims": dims, "Input type": types, "External id": k}
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": k, "dur": 1, "args": args}
        )
    path = tmp_path / "calls.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert_same(path)


def test_flows_to_forward_threads(reader: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    """fwdbwd flows resolved on columns: ids repeated (the last start and end count, the order is
    the first start's), int and string ids alike, flows without an end or hitting no span, two
    flows naming one backward thread id (the first wins), annotations as ends, spans sharing a time."""

    def op(name: str, tid: int, ts: float, cat: str = "cpu_op", **args: object) -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1, "args": args}

    def flow(ph: str, flow_id: object, tid: int, ts: float) -> dict[str, object]:
        return {"ph": ph, "cat": "fwdbwd", "id": flow_id, "pid": 1, "tid": tid, "ts": ts, "name": "fwdbwd"}

    events = [
        op("aten::mm", 1, 10, **{"Sequence number": 1}),
        op("aten::mm", 3, 10, **{"Sequence number": 2}),
        op("other", 1, 10),
        op("ann", 4, 12, cat="user_annotation"),
        op("MmBackward0", 2, 20, **{"Sequence number": 1, "Fwd thread id": 7}),
        op("MmBackward0", 2, 30, **{"Sequence number": 2, "Fwd thread id": 8}),
        op("MmBackward0", 2, 40, **{"Sequence number": 3, "Fwd thread id": 9}),
        op("MmBackward0", 2, 50, **{"Sequence number": 4, "Fwd thread id": 7}),
        flow("s", 5, 3, 10),
        flow("s", 1, 1, 10),
        flow("f", 1, 2, 99),  # hits no span: replaced by the next end of id 1
        flow("f", 1, 2, 20),
        flow("s", "1", 4, 12),  # a string id is another flow
        flow("f", "1", 2, 30),
        flow("f", 5, 2, 50),  # id 5 starts first: it names thread id 7 before id 1 does
        flow("s", 6, 1, 10),  # no end
        flow("f", 8, 2, 40),  # no start
    ]
    path = tmp_path / "flows.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert_same(path)
    path.write_text(json.dumps({"traceEvents": [e for e in events if e.get("cat") != "fwdbwd"]}))
    assert_same(path)


def test_a_key_met_twice_reads_its_last_value(reader: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    # the first "ts" takes the digits path, the second the double's: the second must win, as in Python
    path = tmp_path / "twice.json"
    path.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, '
        '"ts": 1.5, "dur": 2.5, "ts": 1e3, "dur": 1.0005, "args": {"External id": 1}}]}'
    )
    assert_same(path)
