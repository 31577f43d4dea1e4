"""The built documentation site: the generated pages are in it, and its home page renders in a browser.

Builds the site once (``mkdocs build --strict``, as .ci/run does), then checks
that the recipes reference the hook generates and the API page mkdocstrings
writes are there, and takes a headless Chromium screenshot of the home page:
Material's header drawn in its colour, and the navigation holding every
section of mkdocs.yml. Skipped, with the reason, where the docs extra or a
Chromium is not installed (.ci/run installs both).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
