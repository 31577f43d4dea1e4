"""The built documentation site: the generated pages are in it, its HTML holds together, and it renders in a browser.

Builds the site once (``mkdocs build --strict``, as .ci/run does), then checks
that the recipes reference the hook generates and the API page mkdocstrings
writes are there; reads every page's HTML: no table row leaks out as a
paragraph of pipes (a strict build lets that pass), every page whose Markdown
has tables has as many ``<table>``s, every image and internal link (anchor
included) resolves; and takes headless Chromium screenshots: the home page
with Material's header drawn in its colour and the navigation holding every
section of mkdocs.yml, and the home page and the two benchmarks pages whose
tables once leaked, saved in the test's folder with their paths printed.
Skipped, with the reason, where the docs extra, playwright or a Chromium is
not installed (.ci/run installs them).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from helpers import load_tool
from markdown_tables import read_tables

from finetune.config.arguments import DataArguments, FinetuneTrainingArguments, ModelArguments

PROJECT = Path(__file__).parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Material's default primary colour (indigo, #4051b5): the header is drawn in it once the theme's CSS has loaded.
MATERIAL_INDIGO = (64, 81, 181)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built from this checkout into a temporary folder."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")
    folder = tmp_path_factory.mktemp("site")
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(PROJECT)}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(folder)]
    built = subprocess.run(command, cwd=PROJECT, env=environment, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return folder


@dataclasses.dataclass
class RenderedPage:
    """What the checks read from one HTML page: its ids, links, images, paragraphs and tables."""

    ids: set[str] = dataclasses.field(default_factory=set)
    links: list[str] = dataclasses.field(default_factory=list)  # the href of every <a> and the src of every <img>
    paragraphs: list[str] = dataclasses.field(default_factory=list)  # the text of every <p>
    tables: int = 0


class _PageReader(HTMLParser):
    """Fills a RenderedPage from a page's HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.page = RenderedPage()
        self._paragraph: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.page.ids.add(attributes["id"])
        if tag == "a" and attributes.get("href") is not None:
            self.page.links.append(attributes["href"])
        elif tag == "img" and attributes.get("src"):
            self.page.links.append(attributes["src"])
        elif tag == "p":
            self._paragraph = []
        elif tag == "table":
            self.page.tables += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "p" and self._paragraph is not None:
            self.page.paragraphs.append("".join(self._paragraph))
            self._paragraph = None

    def handle_data(self, data: str) -> None:
        if self._paragraph is not None:
            self._paragraph.append(data)


@pytest.fixture(scope="module")
def rendered(site: Path) -> dict[Path, RenderedPage]:
    """Every HTML page of the site, read once, by its path."""
    pages = {}
    for path in sorted(site.rglob("*.html")):
        reader = _PageReader()
        reader.feed(path.read_text(encoding="utf-8"))
        pages[path] = reader.page
    return pages


def test_no_table_row_leaks_as_text(site, rendered):
    leaks = [
        f"{path.relative_to(site)}: {' '.join(text.split())[:120]}"
        for path, page in rendered.items()
        for text in page.paragraphs
        if text.lstrip().startswith("|")
    ]
    assert not leaks, "table rows rendered as a paragraph (a blank line inside a table?):\n" + "\n".join(leaks)


def markdown_pages() -> list[tuple[str, str]]:
    """``(path under docs/, Markdown)`` of every page the site is built from, the generated reference included."""
    pages = [
        (str(path.relative_to(PROJECT / "docs")), path.read_text(encoding="utf-8"))
        for path in sorted((PROJECT / "docs").rglob("*.md"))
    ]
    reference = load_tool("recipes_reference")
    return [*pages, (reference.PAGE, reference.render())]


def html_of(site: Path, page: str) -> Path:
    """Where MkDocs (directory URLs) writes the page ``page`` (a path under docs/)."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def test_every_table_of_the_markdown_is_a_table_in_the_html(site, rendered):
    missing = []
    for page, text in markdown_pages():
        tables = len(read_tables(page, text)[0])
        built = rendered[html_of(site, page)].tables
        if tables and built != tables:
            missing.append(f"{page}: {tables} tables in the Markdown, {built} <table> in the HTML")
    assert not missing, "\n".join(missing)


def test_every_image_and_internal_link_resolves(site, rendered):
    broken = []
    for path, page in rendered.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue  # an outside address: not this site's to check
            if not parts.path:
                target = path  # "#anchor" on the same page
            elif parts.path.startswith("/"):
                target = site / unquote(parts.path).lstrip("/")  # 404.html links from the site's root
            else:
                target = path.parent / unquote(parts.path)
            if target.is_dir():
                target = target / "index.html"
            target = target.resolve()
            where = f"{path.relative_to(site)}: {link}"
            if not target.is_file():
                broken.append(f"{where} (no {target.relative_to(site.resolve())})")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in rendered[target].ids:
                broken.append(f"{where} (no id {parts.fragment!r} there)")
    assert len(rendered) > 20
    assert not broken, "\n".join(broken)


def test_the_built_reference_lists_every_field(site):
    page = (site / "reference" / "recipes" / "index.html").read_text(encoding="utf-8")
    for cls in (ModelArguments, DataArguments, FinetuneTrainingArguments):
        for field in dataclasses.fields(cls):
            if field.init:
                assert f"<code>{field.name}</code>" in page, field.name


def test_the_built_api_page_shows_the_docstrings(site):
    page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name in (
        "training.trainer.ReviewTrainer",
        "training.trainer.ReviewTrainer.training_step",
        "config.arguments.FinetuneTrainingArguments",
        "config.recipes.load_recipe",
        "evaluation.inference.predict_probabilities",
        "errors.FinetuneError",
    ):
        assert f'id="finetune.{name}"' in page, name
    assert "exact accumulation loop" in page  # ReviewTrainer's docstring, not only its name


@pytest.fixture
def browser() -> str:
    """A Chromium on PATH, or a skip saying none is installed."""
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.skip(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); .ci/run installs Debian's chromium")
    return found


def _headless(browser: str, *arguments: str) -> subprocess.CompletedProcess:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_home_page_renders_with_its_navigation(browser, site, tmp_path):
    from PIL import Image

    home = (site / "index.html").as_uri()
    screenshot = tmp_path / "home.png"
    _headless(browser, "--window-size=1280,800", f"--screenshot={screenshot}", home)
    assert screenshot.is_file(), "Chromium wrote no screenshot"
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1280, 800)
    header = image.getpixel((640, 10))
    assert all(abs(got - want) <= 8 for got, want in zip(header, MATERIAL_INDIGO)), f"header colour {header}"
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50, "the page looks blank"

    # The page as the browser built it: its navigation links are every title of mkdocs.yml's nav.
    dom = _headless(browser, "--dump-dom", home).stdout
    links = re.findall(r'class="md-nav__link[^"]*"[^>]*>(.*?)</(?:a|label|span)>', dom, flags=re.DOTALL)
    shown = {" ".join(re.sub(r"<[^>]+>", " ", link).split()) for link in links}
    titles = nav_titles(yaml.safe_load((PROJECT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    assert len(titles) > 10
    assert not titles - shown, f"missing from the rendered navigation: {sorted(titles - shown)}"


def nav_titles(nav: list) -> set[str]:
    """Every section and page title of an mkdocs.yml ``nav``."""
    titles = set()
    for entry in nav:
        if isinstance(entry, dict):
            for title, value in entry.items():
                titles.add(title)
                if isinstance(value, list):
                    titles |= nav_titles(value)
    return titles


def nav_pages(nav: list) -> set[str]:
    """Every page (a path under docs/) of an mkdocs.yml ``nav``."""
    pages = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_the_home_page_links_every_page_of_the_navigation():
    # The home page's map of pages is what a reader who lands there sees first; no page is left out of it.
    home = (PROJECT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]*)?\)", home))
    pages = nav_pages(yaml.safe_load((PROJECT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]) - {"index.md"}
    assert len(pages) > 15
    assert not pages - linked, f"pages of mkdocs.yml's nav the home page does not link: {sorted(pages - linked)}"


# The pages screenshotted, each with the text of a table cell to bring into view: on the benchmarks pages, a
# row that once leaked out of its table as a paragraph of pipes.
SCREENSHOTS = {
    "home": ("index.html", "checkpoint-174"),
    "benchmarks-speed": ("benchmarks/speed/index.html", "ReviewTrainer (one host sync per update)"),
    "benchmarks-quality": ("benchmarks/quality/index.html", "two altered copies of each of the 600 train reviews"),
}


@pytest.mark.parametrize("name", list(SCREENSHOTS))
def test_a_page_renders_its_tables_and_pictures(browser, site, tmp_path, name):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the screenshots drive Chromium with playwright")
    path, cell_text = SCREENSHOTS[name]
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI containers do.
        chromium = playwright.chromium.launch(executable_path=browser, headless=True, args=["--no-sandbox"])
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 900})
            page.goto((site / path).as_uri())
            cell = page.locator("article table td", has_text=cell_text).first
            sync_api.expect(cell).to_be_visible()
            if name != "home":  # the home page is taken whole, from its top
                cell.evaluate("cell => cell.scrollIntoView({block: 'center'})")
                page.wait_for_timeout(500)  # Material's header swaps its title as the page scrolls
            # Every picture of the article loaded (a broken one has no natural width).
            pictures = page.eval_on_selector_all(
                "article img", "images => images.map(image => [image.getAttribute('src'), image.naturalWidth])"
            )
            screenshot = tmp_path / f"{name}.png"
            page.screenshot(path=str(screenshot), full_page=name == "home")
        finally:
            chromium.close()
    print(f"\nscreenshot of {path}: {screenshot}")
    assert not [source for source, width in pictures if not width], f"pictures that did not load: {pictures}"
    if name == "home":
        assert pictures, "the home page shows no picture of a run"
