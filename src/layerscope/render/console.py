"""Console views: the module tree table and the op table, as rich renderables."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Sequence
from typing import IO, Literal

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from layerscope.analysis.frames import achieved_flops_per_s
from layerscope.analysis.peaks import peak_flops_per_s
from layerscope.analysis.steps import StepRow, module_spread
from layerscope.analysis.transform import fold_depth, prune_min_share
from layerscope.model.metrics import FIELD_NAMES, Metrics
from layerscope.model.profile import ModuleNode, OpStats, Phase, Profile
from layerscope.units import fmt_bytes, fmt_share, fmt_si, fmt_time_us

TREE_SORT_KEYS = ("execution", *FIELD_NAMES, "calls", "params")

_UNICODE_GUIDES = ("├── ", "└── ", "│   ", "    ")
_ASCII_GUIDES = ("|-- ", "`-- ", "|   ", "    ")


def _node_sort_key(sort_by: str) -> Callable[[ModuleNode], float]:
    if sort_by == "calls":
        return lambda n: -n.calls
    if sort_by == "params":
        return lambda n: -n.params_total
    return lambda n: -float(getattr(n.total, sort_by))


def _rows(
    node: ModuleNode,
    sort_by: str,
    guides: tuple[str, str, str, str],
    prefix: str = "",
    last: bool = True,
    is_root: bool = True,
) -> list[tuple[str, ModuleNode]]:
    """(label with tree guides, node) in display order; loop-last logic gives the guide shapes."""
    branch, corner, pipe, space = guides
    label = (node.path or "(root)") if is_root else node.name
    out = [(label if is_root else prefix + (corner if last else branch) + label, node)]
    children = list(node.children)
    if sort_by != "execution":
        children.sort(key=_node_sort_key(sort_by))
    child_prefix = "" if is_root else prefix + (space if last else pipe)
    for k, child in enumerate(children):
        out.extend(_rows(child, sort_by, guides, child_prefix, k == len(children) - 1, False))
    return out


def tree_table(
    profile: Profile,
    depth: int | None = None,
    min_share: float = 0.0,
    sort_by: str = "execution",
    ascii_only: bool | None = None,
    max_unattributed: int = 6,
    per_step: bool | None = None,
    peak_tflops: float | None = None,
) -> RenderableType:
    """The module tree: one row per module with forward/backward time, device, memory, FLOPs, params.

    With a known peak (``peak_tflops``, or the device's from :mod:`layerscope.analysis.peaks`), an
    MFU column: achieved FLOP/s over the peak.

    ``depth`` and ``min_share`` (percent of the run's total) fold modules into their ancestors.
    ``per_step`` (default: when the profile holds several steps) shows means per step and a
    "± step" column, the relative standard deviation of each module's time across steps.
    """
    if ascii_only is None:
        ascii_only = _wants_ascii()
    folded_note = ""
    view = profile
    if depth is not None:
        view = fold_depth(view, depth)
    if min_share > 0:
        view, count = prune_min_share(view, min_share)
        if count:
            folded_note = (
                f"{count} module{'s' if count != 1 else ''} under {min_share:g}% folded into their parents"
            )
    device = view.has_device_time
    memory = view.has_memory
    flops = view.totals.flops > 0
    share_field = "device_us" if device else "cpu_us"
    whole = float(getattr(view.totals, share_field))
    steps = len(view.steps)
    if per_step is None:
        per_step = steps > 1
    per_step = per_step and steps > 1
    factor = 1.0 / steps if per_step else 1.0
    spread = module_spread(view) if per_step else {}

    headers = ["Calls", "Fwd self", "Fwd total", "Bwd self", "Bwd total"]
    if device:
        headers += ["Fwd device", "Bwd device"]
    if memory:
        headers += ["Alloc", "Net alloc", "Peak"]
    peak_rate = peak_flops_per_s(view.meta, peak_tflops) if flops else None
    if flops:
        headers += ["FLOPs", "FLOP/s"] + (["MFU"] if peak_rate else [])
    headers += ["Params", "Share"]
    if per_step:
        headers.append("± step")

    def cells(calls: str, fwd: Metrics, bwd: Metrics, params: str, path: str | None = None) -> list[str]:
        share = fmt_share(getattr(fwd, share_field) + getattr(bwd, share_field), whole)
        if per_step:
            fwd, bwd = fwd.scaled(factor), bwd.scaled(factor)
        row = [
            calls,
            fmt_time_us(fwd.self_cpu_us),
            fmt_time_us(fwd.cpu_us),
            fmt_time_us(bwd.self_cpu_us),
            fmt_time_us(bwd.cpu_us),
        ]
        if device:
            row += [fmt_time_us(fwd.device_us), fmt_time_us(bwd.device_us)]
        if memory:
            both = fwd.merged(bwd)
            peak = max(both.cpu_peak_bytes, both.device_peak_bytes)
            row += [
                fmt_bytes(both.cpu_alloc_bytes + both.device_alloc_bytes),
                fmt_bytes(fwd.retained_bytes),
                fmt_bytes(peak),
            ]
        if flops:
            both_phases = fwd.merged(bwd)
            rate = achieved_flops_per_s(both_phases)
            row += [fmt_si(both_phases.flops), fmt_si(rate, "/s") if rate is not None else ""]
            if peak_rate:
                row.append(f"{100 * rate / peak_rate:.1f}%" if rate is not None else "")
        row.append(params)
        row.append(share)
        if per_step:
            found = spread.get(path) if path is not None else None
            row.append(f"±{100 * found.relative:.0f}%" if found is not None and found.mean_us > 0 else "")
        return row

    guides = _ASCII_GUIDES if ascii_only else _UNICODE_GUIDES
    body: list[tuple[Text, str, list[str]]] = []
    for label, node in _rows(view.root, sort_by, guides):
        name = Text(label, style="bold" if not node.children else "")
        node_calls = f"{node.calls / steps:g}" if per_step else str(node.calls)
        values = cells(node_calls, node.forward, node.backward, fmt_si(node.params_total), node.path)
        body.append((name, node.type_name, values))
    entries = sorted(
        _merge_unattributed(view),
        key=lambda e: -(e[1].cpu_us + e[2].cpu_us + e[1].device_us + e[2].device_us),
    )
    extra: list[tuple[Text, str, list[str]]] = []
    for label, fwd_like, bwd_like, count in entries[:max_unattributed]:
        shown_calls = (f"{count / steps:g}" if per_step else str(count)) if count else ""
        values = cells(shown_calls, fwd_like, bwd_like, "")
        extra.append((Text(f"[unattributed] {label}", style="italic"), "", values))
    rest = entries[max_unattributed:]
    if rest:
        fwd_rest, bwd_rest = Metrics(), Metrics()
        for _, f, b, _calls in rest:
            fwd_rest, bwd_rest = fwd_rest.merged(f), bwd_rest.merged(b)
        label_rest = Text(f"[unattributed] {len(rest)} more", style="italic")
        extra.append((label_rest, "", cells("", fwd_rest, bwd_rest, "")))
    total_fwd, total_bwd = view.root.forward, view.root.backward
    for _, f, b, _calls in entries:
        total_fwd, total_bwd = total_fwd.merged(f), total_bwd.merged(b)
    total_row = (Text("total", style="bold"), "", cells("", total_fwd, total_bwd, ""))

    view_table = _FittedTable(
        headers=["Module", "Type", *headers],
        sections=[
            [(name, type_name, *values) for name, type_name, values in body],
            [(name, type_name, *values) for name, type_name, values in extra],
            [(total_row[0], total_row[1], *total_row[2])],
        ],
        ascii_only=ascii_only,
        caption=folded_note,
        drop_order=[
            "FLOP/s",
            "MFU",
            "Params",
            "Net alloc",
            "Fwd self",
            "Bwd self",
            "Peak",
            "Type",
            "Calls",
            "FLOPs",
            "Alloc",
            "Bwd device",
            "Fwd device",
        ],
    )
    title = _title(view, per_step)
    if ascii_only:
        title = title.replace("·", "|").replace("µ", "u")
    return Group(Text(title, style="bold"), view_table)


class _FittedTable:
    """A table fitted to the console width at render time.

    The first column (tree labels, op names) shrinks with an ellipsis down to 24 characters; when
    even that is not enough, whole columns are left out in ``drop_order`` rather than numbers being
    cut in the middle.
    """

    def __init__(
        self,
        headers: list[str],
        sections: Sequence[Sequence[tuple[Text | str, ...]]],
        ascii_only: bool,
        caption: str,
        drop_order: list[str],
        title: str = "",
        text_columns: frozenset[str] | set[str] = frozenset({"Type"}),
    ) -> None:
        self.headers = headers
        self.sections = [s for s in sections if s]
        self.ascii_only = ascii_only
        self.caption = caption
        self.title = title
        self.drop_order = drop_order
        self.text_columns = text_columns

    def _width(self, k: int) -> int:
        cells = [row[k] for section in self.sections for row in section]
        # Multi-line cells (source locations, one frame per line) are as wide as their widest line.
        return max(
            [len(self.headers[k])]
            + [max(map(len, (c.plain if isinstance(c, Text) else c).split("\n"))) for c in cells]
        )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [self._width(k) for k in range(len(self.headers))]
        keep = list(range(len(self.headers)))
        label_min = min(widths[0], 24)
        gutter = 3  # " | " between columns (padding 1 + rule 1 + padding 1), no outer edge

        def needed(columns: list[int]) -> int:
            return sum(widths[k] for k in columns[1:]) + label_min + gutter * (len(columns) - 1)

        for name in self.drop_order:
            if needed(keep) <= options.max_width:
                break
            if name in self.headers and self.headers.index(name) in keep:
                keep.remove(self.headers.index(name))
        label_width = max(label_min, min(widths[0], options.max_width - needed(keep) + label_min))
        overflow: Literal["ellipsis", "crop"] = "crop" if self.ascii_only else "ellipsis"
        table = Table(
            box=box.ASCII2 if self.ascii_only else box.SIMPLE_HEAVY,
            show_edge=False,
            pad_edge=False,
            caption=self.caption or None,
            caption_justify="left",
            title=self.title or None,
            title_justify="left",
            header_style="bold",
        )
        for k in keep:
            header = self.headers[k]
            if k == 0:
                table.add_column(header, no_wrap=True, overflow=overflow, width=label_width)
            elif header in self.text_columns:
                style = "cyan" if header in ("Type", "Module") else None
                table.add_column(header, no_wrap=True, overflow=overflow, width=widths[k], style=style)
            else:
                style = "bold" if header == "Share" else None
                table.add_column(header, justify="right", no_wrap=True, width=widths[k], style=style)
        limits = {k: (label_width if k == 0 else widths[k]) for k in keep}
        for n, section in enumerate(self.sections):
            if n:
                table.add_section()
            for row in section:
                table.add_row(*(self._cell(row[k], limits[k]) for k in keep))
        yield table

    def _cell(self, value: Text | str, width: int) -> Text:
        """Cells are Text, never markup: module and op names such as ``[memory]`` or a ModuleDict key
        ``[bold]`` must print as written. In ASCII mode, units and ellipses are spelled in ASCII and
        long text is clipped here."""
        if not self.ascii_only:
            return value if isinstance(value, Text) else Text(value)
        plain = value.plain if isinstance(value, Text) else value
        plain = plain.replace("µ", "u").replace("…", "...").replace("—", "-")
        if len(plain) > width:
            plain = plain[: max(0, width - 3)] + "..."
        return Text(plain, style=value.style) if isinstance(value, Text) else Text(plain)


def _merge_unattributed(profile: Profile) -> list[tuple[str, Metrics, Metrics, int]]:
    """Unattributed entries by label; backward-phase work in the backward columns, the rest forward."""
    merged: dict[str, tuple[Metrics, Metrics, int]] = {}
    for entry in profile.unattributed:
        f, b, calls = merged.get(entry.label, (Metrics(), Metrics(), 0))
        if entry.phase is Phase.BACKWARD:
            b = b.merged(entry.metrics)
        else:
            f = f.merged(entry.metrics)
        merged[entry.label] = (f, b, calls + entry.calls)
    return [(label, f, b, c) for label, (f, b, c) in merged.items()]


def _title(profile: Profile, per_step: bool = False) -> str:
    meta = profile.meta
    parts = []
    if meta.get("model"):
        parts.append(str(meta["model"]))
    if meta.get("wall_us"):
        parts.append(f"wall {fmt_time_us(float(meta['wall_us']))}")
    parts.append(f"CPU {fmt_time_us(profile.totals.cpu_us) or '0'}")
    if profile.has_device_time:
        parts.append(f"device {fmt_time_us(profile.totals.device_us)}")
    if profile.totals.flops:
        parts.append(f"{fmt_si(profile.totals.flops)}FLOPs")
    if per_step:
        parts.append(f"mean per step of {len(profile.steps)} steps")
    elif len(profile.steps) > 1:
        parts.append(f"{len(profile.steps)} steps")
    return "layerscope · " + " · ".join(parts)


def ops_table(
    rows: Sequence[OpStats],
    ascii_only: bool | None = None,
    title: str | None = None,
    total_cpu_us: float | None = None,
) -> RenderableType:
    """An op table like torch's ``key_averages().table()``, with layerscope's columns."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
    show_shapes = any(r.input_shapes for r in rows)
    show_stack = any(r.stack for r in rows)
    show_module = any(r.module is not None or r.scope for r in rows)
    show_phase = any(r.phase is not None for r in rows)
    device = any(r.metrics.device_us for r in rows)
    memory = any(r.metrics.cpu_alloc_bytes or r.metrics.device_alloc_bytes for r in rows)
    flops = any(r.metrics.flops for r in rows)
    whole = total_cpu_us if total_cpu_us is not None else sum(r.metrics.self_cpu_us for r in rows)
    headers = ["Op"]
    headers += ["Phase"] if show_phase else []
    headers += ["Module"] if show_module else []
    headers += ["Input shapes"] if show_shapes else []
    headers += ["Source location"] if show_stack else []
    headers += ["Calls", "Self CPU", "Self %", "CPU total", "CPU avg"]
    headers += ["Self device", "Device total"] if device else []
    headers += ["Self alloc", "Alloc"] if memory else []
    headers += ["FLOPs"] if flops else []
    body: list[tuple[Text | str, ...]] = []
    for r in rows:
        m = r.metrics
        cells: list[str] = [r.name]
        if show_phase:
            cells.append(r.phase.value if r.phase is not None else "")
        if show_module:
            cells.append(_clip(r.module if r.module is not None else (f"[{r.scope}]" if r.scope else ""), 32))
        if show_shapes:
            cells.append(_clip(r.input_shapes or "", 40))
        if show_stack:  # like torch's "Source Location": one frame per line, innermost first
            cells.append("\n".join(_clip(frame, 60) for frame in r.stack))
        cells += [
            str(r.calls),
            fmt_time_us(m.self_cpu_us),
            fmt_share(m.self_cpu_us, whole),
            fmt_time_us(m.cpu_us),
            fmt_time_us(m.cpu_us / r.calls) if r.calls else "",
        ]
        if device:
            cells += [fmt_time_us(m.self_device_us), fmt_time_us(m.device_us)]
        if memory:
            cells += [
                fmt_bytes(m.self_cpu_alloc_bytes + m.self_device_alloc_bytes),
                fmt_bytes(m.cpu_alloc_bytes + m.device_alloc_bytes),
            ]
        if flops:
            cells.append(fmt_si(m.flops))
        body.append(tuple(cells))
    return _FittedTable(
        headers=headers,
        sections=[body],
        ascii_only=ascii_only,
        caption="",
        title=title or "",
        text_columns={"Phase", "Module", "Input shapes", "Source location"},
        drop_order=[
            "CPU avg",
            "Self alloc",
            "Self %",
            "Self device",
            "Input shapes",
            "Phase",
            "Module",
            "CPU total",
            "Alloc",
            "FLOPs",
            "Device total",
            "Source location",
        ],
    )


def steps_table(rows: Sequence[StepRow], ascii_only: bool | None = None) -> RenderableType:
    """The step table: wall, CPU, device, forward and backward time per step; outliers flagged with
    what made them slow."""
    if ascii_only is None:
        ascii_only = _wants_ascii()
    device = any(r.device_us for r in rows)
    headers = [
        "Step",
        "Wall",
        "CPU",
        *(["Device"] if device else []),
        "Forward",
        "Backward",
        "vs median",
        "Note",
    ]
    body: list[tuple[Text | str, ...]] = []
    for r in rows:
        note = ""
        if r.outlier:
            note = f"slow: {r.cause}" + (f" (+{fmt_time_us(r.cause_excess_us)})" if r.cause_excess_us else "")
        cells = [str(r.step), fmt_time_us(r.wall_us), fmt_time_us(r.cpu_us)]
        cells += [fmt_time_us(r.device_us)] if device else []
        cells += [fmt_time_us(r.forward_us), fmt_time_us(r.backward_us), f"{r.ratio_to_median:.2f}x", note]
        body.append(
            tuple(Text(c, style="bold red") if r.outlier and k == 0 else c for k, c in enumerate(cells))
        )
    outliers = sum(r.outlier for r in rows)
    caption = (
        f"{outliers} outlier step{'s' if outliers != 1 else ''} (wall > 1.5x the median)" if outliers else ""
    )
    return _FittedTable(
        headers=headers,
        sections=[body],
        ascii_only=ascii_only,
        caption=caption,
        drop_order=["Device", "CPU", "Backward", "Forward"],
        text_columns={"Note"},
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _wants_ascii() -> bool:
    if os.environ.get("LAYERSCOPE_ASCII"):
        return True
    encoding = getattr(getattr(__import__("sys"), "stdout", None), "encoding", None) or "utf-8"
    return "utf" not in encoding.lower()


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console honouring NO_COLOR and the terminal width (160 columns when not a terminal)."""
    if width is None:
        width = shutil.get_terminal_size((160, 24)).columns
    return Console(
        file=file,
        width=width,
        no_color=bool(os.environ.get("NO_COLOR")) or None,
        highlight=False,
        soft_wrap=False,
    )


def render_to_text(renderable: RenderableType, width: int | None = None) -> str:
    """Render to plain text (no colour codes): what ``str(profile)`` returns."""
    buffer = io.StringIO()
    if width is None:
        width = shutil.get_terminal_size((160, 24)).columns
    console = Console(file=buffer, width=width, color_system=None, highlight=False, force_terminal=False)
    console.print(renderable)
    return buffer.getvalue()
