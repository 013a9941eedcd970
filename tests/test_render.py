"""Console views: golden outputs from a hand-built profile (never from live timings)."""

from __future__ import annotations

import io

import pytest

from layerscope.attribution import build_profile
from layerscope.model.meta import CaptureInfo, ProfileMeta, SavedOptions
from layerscope.render.console import make_console, ops_table, render_to_text, tree_table
from layerscope.units import fmt_bytes, fmt_share, fmt_si, fmt_time_us
from tests.test_build_synthetic import CATALOG, forward_backward_table


@pytest.fixture
def profile():  # type: ignore[no-untyped-def]
    p = build_profile(
        forward_backward_table(),
        CATALOG,
        ProfileMeta(model="Net", capture=CaptureInfo(options=SavedOptions(memory=True))),
    )
    p.validate()
    return p


def test_tree_table_golden_unicode(profile, golden) -> None:  # type: ignore[no-untyped-def]
    text = render_to_text(tree_table(profile, ascii_only=False), width=150)
    golden("tree_unicode.txt", text)
    # semantic invariants beside the golden: every module once, the total row, the guides
    assert text.count("fc ") == 1 and "└── fc" in text and "total" in text
    assert "[unattributed] aten::sum" in text and "100.0%" in text


def test_tree_table_golden_ascii_narrow(profile, golden) -> None:  # type: ignore[no-untyped-def]
    text = render_to_text(tree_table(profile, ascii_only=True), width=80)
    golden("tree_ascii_80.txt", text)
    assert all(ord(ch) < 128 for ch in text)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "`-- fc" in text


def test_min_share_folds_with_a_note() -> None:
    # CPU-only (no kernel): fc is 90 of 185 µs = 48.6% of the run
    cpu_only = build_profile(forward_backward_table(with_kernel=False), CATALOG)
    text = render_to_text(tree_table(cpu_only, min_share=40, ascii_only=True), width=150)
    assert "`-- fc" in text and "folded" not in text
    text = render_to_text(tree_table(cpu_only, min_share=50, ascii_only=True), width=150)
    assert "1 module under 50% folded into their parents" in text
    assert "`-- fc" not in text
    root_line = next(line for line in text.splitlines() if line.startswith("(root)"))
    assert root_line.split("|")[4].strip() == "100.0us"  # forward self now holds fc's forward too
    assert root_line.split("|")[6].strip() == "60.0us"  # and backward self fc's backward


def test_op_table_golden(profile, golden) -> None:  # type: ignore[no-untyped-def]
    rows = profile.ops(group_by=("name", "module", "phase"), limit=5)
    text = render_to_text(ops_table(rows, ascii_only=True, total_cpu_us=profile.totals.cpu_us), width=150)
    golden("ops_ascii.txt", text)
    assert text.splitlines()[2].lstrip().startswith("aten::mm")  # sorted by self CPU: mm (30 µs) first


def test_no_color(monkeypatch, profile) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NO_COLOR", "1")
    buffer = io.StringIO()
    console = make_console(buffer, width=150)
    console.print(tree_table(profile))
    assert "\x1b[" not in buffer.getvalue()


def test_str_of_profile_is_the_tree(profile) -> None:  # type: ignore[no-untyped-def]
    assert "fc" in str(profile) and "Linear" in str(profile)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.5, "0.5µs"), (999.9, "999.9µs"), (1500, "1.50ms"), (2_500_000, "2.500s"), (0, "")],
)
def test_time_units(value: float, text: str) -> None:
    assert fmt_time_us(value) == text


def test_other_units() -> None:
    assert (
        fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.50 KiB" and fmt_bytes(-(3 << 20)) == "-3.00 MiB"
    )
    assert fmt_bytes(25 << 30) == "25.0 GiB"
    assert fmt_si(1_230) == "1.23K" and fmt_si(4.5e12) == "4.50T" and fmt_si(12) == "12"
    assert fmt_share(1, 3) == "33.3%" and fmt_share(1, 0) == ""


def test_names_that_look_like_markup_print_as_written() -> None:
    from layerscope.attribution import module_range_name
    from layerscope.events import EventKind, EventTable

    t = EventTable()
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 100_000)
    t.add_span(module_range_name("heads.[bold]", "Linear"), EventKind.CPU_OP, 1, 10_000, 50_000)
    t.add_span("[memory]", EventKind.CPU_OP, 1, 20_000, 10_000)
    p = build_profile(t, None)
    tree = render_to_text(tree_table(p, ascii_only=True), width=150)
    assert "`-- [bold]" in tree
    ops = render_to_text(ops_table(p.ops(group_by=("name", "module")), ascii_only=True), width=150)
    assert "[memory]" in ops and "heads.[bold]" in ops


def _header(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("Module"))
    return [title.strip() for title in line.split("|")]


def test_tree_columns_declare_the_drop_order(profile) -> None:  # type: ignore[no-untyped-def]
    from layerscope.render.columns import tree_columns, tree_view
    from layerscope.render.table_fit import drop_order

    columns = tree_columns(tree_view(profile, None, peak_tflops=1))
    assert drop_order(columns) == [
        "flop_rate",
        "mfu",
        "params",
        "net_alloc",
        "fwd_self",
        "bwd_self",
        "peak",
        "type",
        "calls",
        "flops",
        "alloc",
        "bwd_device",
        "fwd_device",
    ]
    ranks = [c.drop for c in columns if c.drop is not None]
    assert len(ranks) == len(set(ranks))


@pytest.mark.parametrize(
    ("width", "kept"),
    [
        (
            300,
            "Module Type Calls Fwd_self Fwd_total Bwd_self Bwd_total Fwd_device Bwd_device Alloc_f+b Fwd_net "
            "Peak_f/b FLOPs FLOP/s MFU Params Share",
        ),
        (120, "Module Type Calls Fwd_total Bwd_total Fwd_device Bwd_device Alloc_f+b FLOPs Share"),
        (100, "Module Fwd_total Bwd_total Fwd_device Bwd_device Alloc_f+b Share"),
        (80, "Module Fwd_total Bwd_total Fwd_device Share"),
    ],
)
def test_narrow_terminals_drop_columns_by_rank(profile, width: int, kept: str) -> None:  # type: ignore[no-untyped-def]
    text = render_to_text(tree_table(profile, ascii_only=True, peak_tflops=1), width=width)
    assert _header(text) == [title.replace("_", " ") for title in kept.split(" ")]
    assert max(len(line) for line in text.splitlines()) <= width


def test_fitted_table_keeps_undroppable_columns_when_nothing_fits() -> None:
    from layerscope.render.table_fit import Column, FittedTable, item

    columns = (
        Column("name", "Name", item(0), justify="left"),
        Column("a", "A", item(1), drop=2),
        Column("b", "B", item(2)),
        Column("c", "C", item(3), drop=1),
        Column("hidden", "Hidden", item(4), shown=False),
    )
    table = FittedTable(columns, [[("x" * 30, "1" * 10, "2" * 10, "3" * 10, "4")]], ascii_only=True)
    assert table.kept_columns(200) == ["name", "a", "b", "c"]
    assert table.kept_columns(60) == ["name", "a", "b"]  # c leaves first (rank 1)
    assert table.kept_columns(45) == ["name", "b"]
    assert table.kept_columns(10) == ["name", "b"]  # never dropped, even when too wide


def test_notebook_op_table_keeps_values_and_units_on_one_line(profile) -> None:  # type: ignore[no-untyped-def]
    import re

    from layerscope.render.html_tables import ops_html

    page = ops_html(profile.ops())
    cells = re.findall(r'<td style="([^"]*)">([^<]*)</td>', page)
    with_units = [(style, text) for style, text in cells if re.fullmatch(r"[\d.]+ \S+", text)]
    assert with_units  # "12.0 µs", "2.0 KiB"...
    assert all("white-space:nowrap" in style for style, _ in with_units)
