"""Profiles in Jupyter: ``Profile._repr_html_`` shows the interactive HTML report inline.

The report is the same self-contained page as ``layerscope report -o x.html``, placed in an
``<iframe srcdoc>`` with ``sandbox="allow-scripts"``. Why an iframe rather than a shadow root: the
report's script and styles address the document by id (``#tree``, ``#ops``...) and a shadow root does
not isolate ids, scripts or global names, so two profiles in one notebook, or the notebook's own CSS,
would interfere; an iframe isolates all of them with no change to the report, and the sandbox gives
its script no access to the notebook (no same-origin). The price: the frame has a fixed height and
scrolls inside.
"""

from __future__ import annotations

import html

from layerscope.model.profile import Profile
from layerscope.render.html import html_report

DEFAULT_HEIGHT_PX = 720


def notebook_html(profile: Profile, height_px: int = DEFAULT_HEIGHT_PX) -> str:
    """The HTML report of ``profile`` as one ``<iframe>`` element for a notebook cell's output."""
    page = html.escape(html_report(profile), quote=True)
    return (
        f'<iframe srcdoc="{page}" sandbox="allow-scripts" title="layerscope report" '
        f'style="width:100%;height:{int(height_px)}px;border:1px solid #d0d0d0;border-radius:4px"></iframe>'
    )
