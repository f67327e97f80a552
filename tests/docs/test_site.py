"""The documentation site as a reader gets it: built strictly (``make docs``, which CI runs
before the suite; built here when it is missing), served on 127.0.0.1 and opened in headless
Chromium. Pages render without console errors or failed requests, every internal link and
anchor resolves, every public name has an API entry, and nothing loads from outside the site."""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import dashboard
import gnnpipe as gp

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
#: Folders of the built site that are not pages (assets, sources, the search index).
NOT_PAGES = ("_static", "_sources", "_images", ".doctrees", "jupyter_execute")


@functools.cache
def _build() -> str:
    """Build the site if it is missing (`make docs` builds it first in CI); the build's error
    output, or "" (once per session, however many tests ask)."""
    if (SITE / "index.html").is_file():
        return ""
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", str(ROOT / "docs"), str(SITE)], check=False, cwd=ROOT,
                          timeout=3000,
                          capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stderr[-3000:]


@pytest.fixture(scope="module")
def site() -> Path:
    if error := _build():
        pytest.fail(f"the documentation does not build:\n{error}")
    return SITE


@pytest.fixture(scope="module")
def url(site: Path):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()
    httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _pages(site: Path) -> list[Path]:
    return [p for p in sorted(site.rglob("*.html"))
            if not any(part in NOT_PAGES for part in p.relative_to(site).parts)]


#: (page, a heading it shows, what must have rendered there: a CSS selector and a minimum count)
PAGES = [
    ("getting-started.html", "A first run", ".cell_output", 4),
    ("concepts/schedules.html", "Schedules and the bubble", ".bk-Canvas, canvas", 1),
    ("notebooks/01_quickstart.html", "Quickstart", ".cell_output", 6),
    ("api/training.html", "Training", "dt#gnnpipe\\.train", 1),
]


@pytest.mark.parametrize("page, heading, selector, at_least", PAGES,
                         ids=[p[0] for p in PAGES])
def test_a_page_renders_without_console_errors(page, heading, selector, at_least, url, browser):
    tab = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    tab.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
           if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    tab.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    tab.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
           if r.status >= 400 else None)
    try:
        tab.goto(f"{url}/{page}", wait_until="networkidle", timeout=120_000)
        tab.get_by_role("heading", name=heading).first.wait_for(timeout=30_000)
        if "canvas" in selector:  # BokehJS draws its plots after the page loads
            tab.locator("canvas").first.wait_for(timeout=60_000)
        assert tab.locator(selector).count() >= at_least, f"{page}: fewer than {at_least} {selector}"
        tab.wait_for_timeout(500)  # late errors of scripts still running
    finally:
        tab.close()
    assert not problems, problems[:5]


def test_every_public_name_has_an_api_entry(site):
    from sphinx.util.inventory import InventoryFile

    with (site / "objects.inv").open("rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    documented = {name for kind in inventory.values() for name in kind}
    expected = {f"gnnpipe.{n}" for n in gp.__all__ if n != "__version__"}
    for module in (gp.datasets, gp.models, gp.schedule):
        expected |= {f"{module.__name__}.{n}" for n in module.__all__}
    expected |= {f"dashboard.{n}" for n in dashboard.__all__}
    missing = sorted(expected - documented)
    assert not missing, f"no API entry for {missing}"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        for name in ("href", "src"):
            if values.get(name) and not (tag == "link" and values.get("rel") == "preload"):
                self.links.append(values[name])


@functools.cache
def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_every_internal_link_and_anchor_resolves(site):
    broken = []
    for page in _pages(site):
        for link in _parse(page).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {link}")
            elif parts.fragment and target.suffix == ".html" and "_modules" not in \
                    target.parts and parts.fragment not in _parse(target).ids:
                # (a source page's anchors are per definition line, and a Protocol's stub
                # methods get none: the link still opens the right module)
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert not broken, broken[:10]
    assert len(_pages(site)) >= 30  # every section was built


def test_no_page_loads_anything_from_outside_the_site(site):
    outside = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["']https?://""")
    loading = [str(p.relative_to(site)) for p in _pages(site)
               if outside.search(p.read_text(encoding="utf-8"))]
    assert not loading, loading[:10]


def test_the_readme_is_short_and_stands_alone():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert "../shared" not in readme and "make test" in readme and "make demo" in readme
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        if "://" not in link:
            assert (ROOT / link).exists(), f"README links to {link}, which the repository lacks"


def test_no_code_cites_a_document_outside_the_repository():
    cited = []
    for path in [*ROOT.glob("gnnpipe/**/*.py"), *ROOT.glob("dashboard/**/*.py"),
                 *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"),
                 *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("docs/**/*.md")]:
        text = path.read_text(encoding="utf-8")
        if path == Path(__file__):
            continue
        if re.search(r"shared/DESIGN|(?<![\w/])DESIGN\.md", text):
            cited.append(str(path.relative_to(ROOT)))
    assert not cited, cited
