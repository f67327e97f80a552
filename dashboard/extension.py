"""HoloViews' bokeh backend and Panel's extension, loaded once by every module that draws.

In Jupyter, BokehJS and Panel's JS go into the notebook itself, so an executed notebook shows its
dashboards offline too (a served page loads them from the server either way).
"""

from __future__ import annotations

import functools
import sys

import holoviews as hv
import panel as pn

__all__ = ["load"]


@functools.cache
def load() -> None:
    """Load both extensions (a no-op after the first call)."""
    inline = "ipykernel" in sys.modules
    hv.extension("bokeh", logo=False, inline=inline)
    pn.extension(notifications=False, inline=inline)
