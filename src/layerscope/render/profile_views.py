"""The Profile's convenience methods, served from above the data model: ``p.ops()``, ``p.lines()``,
``p.by_type()``, ``p.to_pandas()`` (computed by analysis), ``print(p)``, ``p.save()`` and the
notebook display of profiles, op tables, line tables and diffs (drawn by render).

:func:`install` registers them once, at ``import layerscope``; the model declares what it needs
(``ProfileViews`` in model/profile.py, ``NotebookDisplay`` in model/display.py) and imports nothing
above it. The implementations are imported when first used, so registering costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope.model.critical_path import register_critical_path
from layerscope.model.display import register_html
from layerscope.model.profile import OpTable, Phase, Profile, register_views
from layerscope.model.roofline import register_roofline
from layerscope.model.tables import LineTable, TypeTable

if TYPE_CHECKING:
    import pandas
    from rich.console import RenderableType

    from layerscope.analysis.diff import ProfileDiff


class _Views:
    """:class:`layerscope.model.profile.ProfileViews` over analysis and render."""

    def ops(
        self,
        profile: Profile,
        sort_by: str,
        group_by: Sequence[str],
        phase: Phase | str | None,
        module: str | None,
        limit: int | None,
        stack_depth: int | None,
        internal_frames: bool,
    ) -> OpTable:
        from layerscope.analysis.ops import op_table

        return op_table(profile, sort_by, group_by, phase, module, limit, stack_depth, internal_frames)

    def lines(self, profile: Profile, sort_by: str, limit: int | None, module: str | None) -> LineTable:
        from layerscope.analysis.lines import line_table

        return line_table(profile, sort_by=sort_by, limit=limit, module=module)

    def by_type(self, profile: Profile, depth: int | None, sort_by: str) -> TypeTable:
        from layerscope.analysis.types import type_table

        return type_table(profile, depth=depth, sort_by=sort_by)

    def to_pandas(self, profile: Profile, table: str) -> pandas.DataFrame:
        from layerscope.analysis.frames import to_pandas

        return to_pandas(profile, table)

    def console(self, profile: Profile) -> RenderableType:
        from layerscope.render.console import tree_table

        return tree_table(profile)

    def text(self, profile: Profile) -> str:
        from layerscope.render.console import render_to_text, tree_table

        return render_to_text(tree_table(profile))

    def write(
        self, profile: Profile, path: Path, *, metric: str, frames: str, internal_frames: bool
    ) -> list[Path]:
        from layerscope.render.writers import ExportOptions, write_outputs

        options = ExportOptions(metric=metric, frames=frames, internal_frames=internal_frames)
        return write_outputs(profile, [path], options)


def _profile_html(profile: Profile) -> str:
    from layerscope.render.notebook import notebook_html

    return notebook_html(profile)


def _ops_html(table: OpTable) -> str:
    from layerscope.render.html_tables import ops_html

    return ops_html(table)


def _lines_html(table: LineTable) -> str:
    from layerscope.render.html_tables import lines_html

    return lines_html(table)


def _diff_html(d: ProfileDiff) -> str:
    from layerscope.render.html_tables import diff_html

    return diff_html(d)


def install() -> None:
    """Register the views and the notebook drawings (idempotent; ``layerscope/__init__`` calls it)."""
    from layerscope.analysis.critical_path import profile_critical_path
    from layerscope.analysis.diff import ProfileDiff
    from layerscope.analysis.roofline import profile_roofline

    register_views(_Views())
    register_critical_path(profile_critical_path)
    register_roofline(profile_roofline)
    register_html(Profile, _profile_html)
    register_html(OpTable, _ops_html)
    register_html(LineTable, _lines_html)
    register_html(ProfileDiff, _diff_html)


__all__ = ["install"]
