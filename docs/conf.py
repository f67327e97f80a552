"""Sphinx configuration of gnnpipe's documentation site (``make docs``).

Pages are MyST markdown; pages with ``{code-cell}``s and the notebooks are executed at build
time by myst-nb, so every output on the site is what the code printed. Three things are made at
build time (``_ext/gnnpipe_site.py``): the notebooks are copied in from ``notebooks/``, the benchmark
pages are written from ``benchmarks/results/*.md``, and the HoloViews/Panel outputs load their
JavaScript and CSS from the site itself instead of a CDN (a page works offline).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

# Executed pages train small models: one torch thread per kernel keeps a busy machine from
# oversubscribing its cores (as the notebook tests do), and the named datasets come from the
# data folder beside the checkout when there is one.
os.environ.setdefault("OMP_NUM_THREADS", "1")
_SHARED_DATA = HERE.parents[1] / "shared" / "data"
if "GNNPIPE_DATA" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["GNNPIPE_DATA"] = str(_SHARED_DATA)

import gnnpipe

project = "gnnpipe"
author = "the gnnpipe developers"
copyright = "2026, the gnnpipe developers"
release = version = gnnpipe.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "gnnpipe_site",
]

exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints", "_ext"]
# No math extension: MathJax would load from a CDN; formulas are written out as text.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# --- executing pages and notebooks
nb_execution_mode = "cache"
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# A HoloViews output carries its loader script (application/javascript, fetching BokehJS from
# a CDN) beside the plot's own HTML; the site loads BokehJS and Panel itself (html_js_files), so
# the loader and HoloViews' private mime types are dropped.
nb_mime_priority_overrides = [("html", "application/javascript", None)]
# Progress bars (tqdm) are Jupyter widgets in a kernel; the site shows their text form and loads
# no widget JavaScript (it would come from a CDN).
nb_mime_priority_overrides += [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
suppress_warnings = ["mystnb.unknown_mime_type", "mystnb.mime_priority"]

# --- API reference
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# --- HTML
html_theme = "pydata_sphinx_theme"
html_title = "gnnpipe"
html_favicon = "_static/favicon.svg"
html_static_path = ["_static"]
html_css_files = ["gnnpipe.css"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_context = {"default_mode": "light"}
html_show_sourcelink = False
