"""What the site makes at build time: the notebooks' pages, the benchmark pages, and HoloViews /
Panel outputs that load their JavaScript and CSS from the site rather than a CDN."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import bokeh
import panel
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent
_BOKEH_JS = ("bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js")
_PANEL_CDN = re.compile(r"https://cdn\.holoviz\.org/panel/[^/]+/dist/([^\"'\s?\\)]+)")
_OTHER_CDN = re.compile(r"https://cdn\.(bokeh\.org|holoviz\.org)/[^\"'\s]+")
#: Panel's files the pages written in this build load (copied into ``_static/panel/``).
_PANEL_FILES: set[str] = set()


def _write(path: Path, text: str | bytes) -> None:
    """Write only when the content changes, so unchanged pages keep their execution cache."""
    data = text.encode() if isinstance(text, str) else text
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def copy_notebooks() -> list[str]:
    """``notebooks/*.ipynb`` into ``docs/notebooks/``, where the notebooks' page lists them."""
    names = []
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        _write(DOCS / "notebooks" / nb.name, nb.read_bytes())
        names.append(nb.stem)
    for stale in (DOCS / "notebooks").glob("*.ipynb"):
        if stale.stem not in names:
            stale.unlink()
    return names


def _script_of(stem: str) -> str | None:
    """The benchmark script that writes ``results/<stem>.md`` (``efficiency_32_chunks`` is
    ``efficiency.py``'s)."""
    scripts = sorted((p.stem for p in (REPO / "benchmarks").glob("[!_]*.py")), key=len,
                     reverse=True)
    return next((s for s in scripts if stem == s or stem.startswith(f"{s}_")), None)


def write_benchmark_pages() -> None:
    """One page per ``benchmarks/results/*.md`` (its own text, the script named under its
    title) and an index table of them, in ``docs/benchmarks/``."""
    out = DOCS / "benchmarks"
    if out.exists():
        shutil.rmtree(out)
    rows, names = [], []
    for md in sorted((REPO / "benchmarks" / "results").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        title, _, rest = text.partition("\n")
        if not title.startswith("# "):
            raise ExtensionError(f"{md}: expected a '# title' first line, got {title[:60]!r}")
        script = _script_of(md.stem)
        source = f"`benchmarks/{script}.py`" if script else "a benchmark script"
        note = (f"\n*Written by {source} into `benchmarks/results/{md.name}`; the raw numbers "
                f"are in `{md.stem}.json` beside it.*\n")
        _write(out / md.name, f"{title}\n{note}{rest}")
        rows.append(f"| [{title[2:].strip()}]({md.stem}.md) | {source} |")
        names.append(md.stem)
    toc = "\n".join(names)
    index = ("# Benchmarks\n\nEvery figure the documentation quotes comes from one of these "
             "pages. Each is what a script under `benchmarks/` wrote into `benchmarks/results/` "
             "when it last ran at full size on the project's 2-core CPU machine (shared and "
             "noisy: read ratios measured side by side in one run, not absolute times); this "
             "page is generated from those files when the site is built. "
             "{doc}`../performance` explains what they mean.\n\n"
             "| results | script |\n|---|---|\n" + "\n".join(rows) +
             f"\n\n```{{toctree}}\n:hidden:\n\n{toc}\n```\n")
    _write(out / "index.md", index)


def _builder_inited(app: Sphinx) -> None:
    copy_notebooks()
    write_benchmark_pages()
    js = Path(app.outdir).parent / ".site_static"
    js.mkdir(parents=True, exist_ok=True)
    for name in _BOKEH_JS:
        _write(js / name, (Path(bokeh.__file__).parent / "server/static/js" / name).read_bytes())
    _write(js / "panel.min.js", (Path(panel.__file__).parent / "dist/panel.min.js").read_bytes())
    app.config.html_static_path.append(str(js))


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                  doctree: Any) -> None:
    """On a page with HoloViews / Panel output: load BokehJS and Panel from ``_static`` and
    point Panel's stylesheets at the site's copies."""
    body = context.get("body", "")
    if "data-root-id" not in body:
        return
    for name in (*_BOKEH_JS, "panel.min.js"):
        app.add_js_file(name)
    local = context["pathto"]("_static/panel/", 1)
    _PANEL_FILES.update(_PANEL_CDN.findall(body))
    body = _PANEL_CDN.sub(lambda m: local + m.group(1), body)
    if left := _OTHER_CDN.search(body):
        raise ExtensionError(f"{pagename}: an output still loads {left.group(0)} from a CDN")
    context["body"] = body


def _build_finished(app: Sphinx, error: BaseException | None) -> None:
    if error is not None or app.builder.name != "html":
        return
    dist = Path(panel.__file__).parent / "dist"
    for rel in sorted(_PANEL_FILES):
        src = dist / rel
        if not src.is_file():
            raise ExtensionError(f"an output loads Panel's {rel}, which {dist} lacks")
        _write(Path(app.outdir) / "_static" / "panel" / rel, src.read_bytes())


def _source_module(app: Sphinx, modname: str | None, attribute: str) -> str | None:
    """The module whose source page shows ``modname.attribute``: where it is defined when that
    is gnnpipe's or the dashboard's (re-exported names), else ``modname`` itself (an attribute
    whose value is an ``int`` would otherwise point at ``builtins``, which has no page)."""
    import importlib

    if not modname:
        return None
    value: Any = importlib.import_module(modname)
    for part in attribute.split("."):
        value = getattr(value, part, None)
    home = getattr(value, "__module__", None)
    return home if isinstance(home, str) and home.startswith(("gnnpipe", "dashboard")) else modname


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("viewcode-follow-imported", _source_module)
    app.connect("builder-inited", _builder_inited)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": False, "parallel_write_safe": False}
