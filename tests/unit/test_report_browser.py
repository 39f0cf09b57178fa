"""The report as a person sees it: rendered by headless Chromium (Debian's package, driven by
Selenium) from a saved run of several rounds (tests/fixtures/results-rounds: the latency spec's
all-to-all back to back on the 3-VM lab, 2026-11-27, every rxelab algorithm against MPI over UCX
and over TCP at 1 KiB to 1 MiB: two whole rounds and part of a third, interrupted when a VM's
data NIC wedged, so the report also says INCOMPLETE). In a window of 1280 x 900 the headline (who wins
against MPI, by how much, with the rounds' spread) is above the fold, no page scrolls sideways,
every table but the full one fits its column, and every plot loads. The screenshot stays in the
test's directory for a person to look at (its path is printed)."""

import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from experiments import report

pytestmark = pytest.mark.slow  # headless Chromium renders a report

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "results-rounds"
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WIDTH, HEIGHT = 1280, 900

LAYOUT = """
const tables = [...document.querySelectorAll('table')];
return {
  page: [document.documentElement.scrollWidth, window.innerWidth],
  tables: tables.map(t => ({
      width: t.offsetWidth, room: t.parentElement.clientWidth,
      scrolls: getComputedStyle(t.parentElement).overflowX === 'auto',
      box: t.parentElement.getBoundingClientRect().right,
      last: t === tables[tables.length - 1]})),
  images: [...document.images].map(i => [i.alt, i.complete && i.naturalWidth > 0, i.naturalWidth]),
  headline: [...document.querySelectorAll('.headline')].map(
      h => [h.getBoundingClientRect().top, h.getBoundingClientRect().bottom, h.innerText]),
};
"""


@pytest.fixture(scope="module")
def browser():
    for path in (CHROMIUM, DRIVER):
        assert path.exists(), f"{path}: `bash infra/install-deps.sh test` installs it"
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(DRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_report_reads_at_a_glance_in_a_real_browser(browser, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    html_path, _ = report.write(run)
    browser.set_window_size(WIDTH, HEIGHT)
    browser.get(html_path.as_uri())
    seen = browser.execute_script(LAYOUT)
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10000
    print(f"screenshot: {shot}")
    page_width, window = seen["page"]
    assert page_width <= window, "the page never scrolls sideways"
    assert seen["headline"], "a headline"
    top, bottom, words = seen["headline"][0]
    assert 0 <= top and bottom <= HEIGHT, "the first headline is above the fold, whole"
    assert "Best rxelab algorithm:" in words and "x the time of MPI over UCX: " in words
    assert "rounds' spread" in words and "(rounds: " in words, "the ratio comes with its spread"
    for t in seen["tables"]:
        assert t["box"] <= window, "no table's box reaches past the window"
        if t["last"]:
            assert t["scrolls"], "the full table scrolls inside its own box"
        else:
            assert t["width"] <= t["room"], f"a table wider than its column: {t}"
    assert seen["images"] and all(ok for _, ok, _ in seen["images"]), seen["images"]
    assert {alt for alt, _, _ in seen["images"]} >= {"memory.png", "ratio-to-ucx.png"}
