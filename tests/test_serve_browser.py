"""`fid serve`'s page in a real browser: headless Chromium from the system's packages (Debian's
chromium and chromium-driver; `make setup` installs them) driven by Selenium 4.

Selenium rather than Playwright: it drives the system's own chromedriver through the W3C
WebDriver protocol, so no browser build of its own is downloaded (Playwright pins its own
Chromium build and speaks a private protocol that a distribution's Chromium may not match), and
given the driver's and the browser's paths Selenium Manager looks nothing up on the network.

One test: a question typed and submitted shows the API's answer and passages (the page's table
against POST /api/ask's record, value for value), and a blank one the API's error.
"""

from __future__ import annotations

import http.client
import json
import shutil

import huggingface_hub.constants
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from tiny_run import N_PASSAGES, load_system, serving, write_tiny_run

WAIT_S = 60  # a loaded 2-core machine starts Chromium in seconds, not minutes


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, toy_world):
    run = write_tiny_run(tmp_path_factory.mktemp("workflow"), tiny_model_dir, toy_world)
    with serving(load_system(run)) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "make setup installs chromium and chromium-driver (apt-get)"
    options = Options()
    options.binary_location = chromium
    # --no-sandbox: Chromium's sandbox refuses to run as root (CI containers)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def _api(server, question: str) -> dict:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        connection.request("POST", "/api/ask", json.dumps({"question": question}).encode(),
                           {"Content-Type": "application/json"})  # fmt: skip
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def _text(element) -> str:
    return element.get_attribute("textContent")


def _assert_marked(rows, reply: dict) -> int:
    """Each row marks every occurrence of the answer in its passage (ignoring case), and only
    those; the number marked."""
    answer, marked = reply["answer"].strip().lower(), 0
    for row, passage in zip(rows, reply["passages"], strict=True):
        marks = [_text(m) for m in row.find_elements(By.CSS_SELECTOR, "td.text mark")]
        assert len(marks) == (passage["text"].lower().count(answer) if answer else 0)
        assert all(m.lower() == answer for m in marks)
        assert _text(row.find_element(By.CSS_SELECTOR, "td.text")) == passage["text"]
        marked += len(marks)
    return marked


def test_the_page_shows_what_the_api_answers(server, browser, toy_world):
    question = toy_world.splits["dev"][0].question
    browser.get(server.url)
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda b: "reader tokens" in b.find_element(By.ID, "system").text)
    box = browser.find_element(By.ID, "question")
    box.send_keys(question)
    browser.find_element(By.ID, "ask").click()
    wait.until(lambda b: b.find_element(By.ID, "result").is_displayed())
    rows = browser.find_elements(By.CSS_SELECTOR, "#passages tbody tr")

    expected = _api(server, question)
    assert _text(browser.find_element(By.ID, "answer")) == expected["answer"]
    assert len(rows) == len(expected["passages"]) == N_PASSAGES
    for row, passage in zip(rows, expected["passages"], strict=True):
        cells = {name: _text(row.find_element(By.CSS_SELECTOR, f"td.{name}"))
                 for name in ("rank", "id", "title", "score", "attention", "text")}  # fmt: skip
        assert cells["rank"] == str(passage["rank"])
        assert (cells["id"], row.get_attribute("data-id")) == (passage["id"], passage["id"])
        assert cells["title"] == passage["title"] and cells["text"] == passage["text"]
        # the values the page was given (shortest round-trip text, as Python's repr) ...
        assert float(row.get_attribute("data-score")) == passage["score"]
        assert float(row.get_attribute("data-attention")) == passage["attention"]
        # ... and as it shows them
        assert cells["score"] == f"{passage['score']:.4f}"
        assert cells["attention"] == f"{100 * passage['attention']:.1f}%"
    _assert_marked(rows, expected)
    # The tiny reader's answer is in no passage: the page's own rendering of a reply whose
    # answer is (in other case) a word of the first passage marks each occurrence.
    word = expected["passages"][0]["text"].split()[1].strip(".,").upper()
    browser.execute_script("show(arguments[0])", {**expected, "answer": word})
    rows = browser.find_elements(By.CSS_SELECTOR, "#passages tbody tr")
    assert _assert_marked(rows, {**expected, "answer": word}) > 0

    box.clear()
    box.send_keys("   ")
    browser.find_element(By.ID, "ask").click()
    wait.until(lambda b: _text(b.find_element(By.ID, "error")))
    assert _text(browser.find_element(By.ID, "error")) == "question: empty: expected a question"
    assert not browser.find_element(By.ID, "result").is_displayed()
