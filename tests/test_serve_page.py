"""The page at ``/`` used as a person would, in headless Chromium: type a review, press the button, read the label.

Driven with Playwright on the system's Chromium (Debian's ``chromium``, which
``.ci/run`` installs); skipped with the reason where either is missing. The
screenshot is saved in the test's folder and its path printed.
"""

from __future__ import annotations

import csv
import io
import shutil

import pytest

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="the page test drives Chromium with playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium on this machine (apt-get install chromium)", allow_module_level=True)

from serving import TOKEN  # noqa: E402

CLASSES = ["negative", "neutral", "positive"]


@pytest.fixture
def page_url(token_server) -> str:
    """The page of the server the API tests use; it needs the token, which the page asks for."""
    return f"http://127.0.0.1:{token_server.port}/"


@pytest.fixture
def page():
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI containers do.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1100, "height": 700})
        finally:
            browser.close()


def open_with_token(page, url: str) -> None:
    """Open the page, and give the token it asks for (the server needs one)."""
    page.goto(url)
    sync_api.expect(page.locator("#model-info")).to_contain_text("needs a token")
    page.fill("#token", TOKEN)
    page.press("#token", "Enter")  # a change event: the page loads /info with it
    sync_api.expect(page.locator("#model-info")).to_contain_text("classes: negative, neutral, positive")


def test_type_a_review_press_the_button_read_the_label(page, page_url, tmp_path):
    open_with_token(page, page_url)
    page.fill("#reviews", "Stopped working after a week and the refund never came.")
    page.click("#run")
    row = page.locator("tr.result")
    sync_api.expect(row).to_have_count(1, timeout=60_000)
    label = row.locator("td.label").inner_text()
    screenshot = tmp_path / "serve-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    print(f"\nscreenshot of the page: {screenshot}")
    assert label in CLASSES
    # The label is the class the bars give the highest probability.
    values = [float(value) for value in row.locator(".probability .value").all_inner_texts()]
    assert len(values) == 3 and CLASSES[values.index(max(values))] == label
    assert "Stopped working after a week" in row.locator("td.review").inner_text()
    marks = row.locator("mark.word")
    assert marks.count() > 0
    assert all(text.strip() for text in marks.all_inner_texts())


def test_drop_a_csv_and_download_the_results(page, page_url, tmp_path):
    reviews = ["Great value, works well.", 'Broke in a day, "support" never answered.', "It is fine, I guess."]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "review"])
    writer.writerows([index, review] for index, review in enumerate(reviews))
    open_with_token(page, page_url)
    page.set_input_files(
        "#file", files=[{"name": "mine.csv", "mimeType": "text/csv", "buffer": buffer.getvalue().encode()}]
    )
    sync_api.expect(page.locator("#file-note")).to_have_text('3 reviews from mine.csv (column "review")')
    page.click("#run")
    sync_api.expect(page.locator("tr.result")).to_have_count(3, timeout=60_000)
    with page.expect_download() as download:
        page.click("#download")
    rows = list(csv.DictReader(io.StringIO(download.value.path().read_text(encoding="utf-8"))))
    assert [row["review"] for row in rows] == reviews
    assert [row["label"] for row in rows] == page.locator("tr.result td.label").all_inner_texts()
    for row in rows:
        assert abs(sum(float(row[f"prob_{name}"]) for name in CLASSES) - 1) < 1e-3


def test_the_download_writes_no_formula_and_the_page_reads_it_back_whole(page, page_url, tmp_path):
    # What a spreadsheet runs: each review is a formula (issue 48); the page guards them as predict does.
    formulas = ['=HYPERLINK("http://example.com/x","click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)"]
    open_with_token(page, page_url)
    page.fill("#reviews", "\n".join(formulas))
    page.click("#run")
    sync_api.expect(page.locator("tr.result")).to_have_count(4, timeout=60_000)
    with page.expect_download() as download:
        page.click("#download")
    guarded = download.value.path().read_bytes()
    cells = list(csv.reader(io.StringIO(guarded.decode("utf-8"), newline="")))
    assert [row[0] for row in cells[1:]] == ["'" + text for text in formulas]
    assert not [cell for row in cells for cell in row if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
    # The file the page wrote, dropped on the page again: the reviews as they were typed.
    page.fill("#reviews", "")
    page.set_input_files("#file", files=[{"name": "back.csv", "mimeType": "text/csv", "buffer": guarded}])
    sync_api.expect(page.locator("#file-note")).to_have_text('4 reviews from back.csv (column "review")')
    assert page.input_value("#reviews").split("\n") == formulas
    # The toggle: cells as they are, for a reader that is not a spreadsheet.
    page.check("#raw-csv")
    with page.expect_download() as download:
        page.click("#download")
    rows = list(csv.DictReader(io.StringIO(download.value.path().read_text(encoding="utf-8"))))
    assert [row["review"] for row in rows] == formulas
