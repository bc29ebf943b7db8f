"""The chat page of ``reprolm serve`` in a real browser: headless Chromium from
Debian's packages driven by Selenium, against the real server on a loopback port.

The page asks for the API key and refuses cleanly without it; a reply streams in, replays to
the same bytes and changes with the seed (each compared with the library's own reply); the
exported request and the shared link reproduce it; the per-token view shows the
probabilities; model output holding HTML and ``<script>`` stays text; nothing is fetched from
anywhere but the server. The per-token test saves the screenshot in
``docs/images/chat-page.png`` (the docs page shows it).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import httpx
import pytest
from _serving import API_KEY, ServerProcess
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

import reprolm
from reprolm.server import ServerConfig, model_fingerprint


SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "chat-page.png"
STORY = "Tell me a story about a cat."
# Sampling from softmax(z) itself, so that two seeds lead to different replies.
PLAIN = {"temperature": "1", "top-p": "1", "top-k": "0", "min-p": "0"}
T = TypeVar("T")

# Recorded in the page before its own script runs: uncaught errors and rejected promises.
RECORD_ERRORS = """
window.__pageErrors = [];
window.addEventListener("error", (e) => window.__pageErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.__pageErrors.push(String(e.reason)));
"""

# Records the length of the newest reply's text at every change of the conversation.
WATCH_STREAM = """
window.__lengths = [];
const conversation = document.getElementById("conversation");
new MutationObserver(() => {
  const replies = conversation.querySelectorAll(".msg.assistant .content");
  if (replies.length) window.__lengths.push(replies[replies.length - 1].textContent.length);
}).observe(conversation, {childList: true, subtree: true, characterData: true});
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "install Debian's chromium and chromium-driver (scripts/test.sh does, as root)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,960", "--no-first-run", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
                # no network beyond this machine: any other host fails to resolve
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_ERRORS})
        yield driver
    finally:
        driver.quit()


def wait_for(what: Callable[[], Optional[T]], timeout: float = 60.0, message: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutException(message or "timed out")
        time.sleep(0.05)


def by_id(driver: WebDriver, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def open_page(driver: WebDriver, server: ServerProcess, url: str = "") -> None:
    """Loads the page (``url``, else the server's root), entering the API key if it asks."""
    driver.get(url or f"{server.url}/")
    loaded = lambda: by_id(driver, "model-name").text != "\u2014"  # noqa: E731
    if wait_for(lambda: "ready" if loaded() else "key" if by_id(driver, "key-dialog").is_displayed() else None,
                10, "the page neither loaded the model nor asked for the key") == "key":
        by_id(driver, "api-key").send_keys(API_KEY)
        by_id(driver, "key-submit").click()
        wait_for(loaded, 10, "the model name did not load")


def set_value(driver: WebDriver, element_id: str, value: str) -> None:
    field = by_id(driver, element_id)
    field.clear()
    if value:
        field.send_keys(value)


def set_checked(driver: WebDriver, element_id: str, checked: bool) -> None:
    box = by_id(driver, element_id)
    if box.is_selected() != checked:
        box.click()


def settings(driver: WebDriver, **values: str) -> None:
    for name, value in values.items():
        set_value(driver, name.replace("_", "-"), value)


def replies(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#conversation .msg.assistant")


def wait_reply(driver: WebDriver, count: int) -> WebElement:
    """The ``count``-th reply, once it is no longer streaming."""
    def done() -> Optional[WebElement]:
        found = replies(driver)
        if len(found) >= count and found[count - 1].get_attribute("data-state") != "streaming":
            return found[count - 1]
        return None
    return wait_for(done, message=f"reply {count} did not finish")


def send(driver: WebDriver, text: str) -> WebElement:
    count = len(replies(driver)) + 1
    set_value(driver, "prompt", text)
    by_id(driver, "send").click()
    return wait_reply(driver, count)


def text_of(reply: WebElement) -> str:
    return str(reply.find_element(By.CSS_SELECTOR, ".content").get_property("textContent"))


def meta(reply: WebElement, name: str) -> str:
    return str(reply.find_element(By.CSS_SELECTOR, f".meta .{name}").get_property("textContent"))


def replay(reply: WebElement) -> WebElement:
    reply.find_element(By.CSS_SELECTOR, "button.replay").click()
    marker = reply.find_element(By.CSS_SELECTOR, ".replay-result")
    wait_for(lambda: marker.get_attribute("data-result") not in (None, "running"), message="replay did not finish")
    return marker


def exported_request(driver: WebDriver, reply: WebElement) -> tuple[str, str]:
    """The exact request body and the shared link of ``reply``, from its export dialog."""
    reply.find_element(By.CSS_SELECTOR, "button.export").click()
    body = str(by_id(driver, "export-json").get_property("textContent"))
    link = str(by_id(driver, "share-link").get_property("value"))
    by_id(driver, "export-close").click()
    return body, link


def page_errors(driver: WebDriver) -> list[str]:
    return list(driver.execute_script("return window.__pageErrors || [];"))


def post_streamed(server: ServerProcess, body: str) -> dict[str, Any]:
    """The reply text and logprobs content of a streamed chat request sent as exactly ``body``."""
    text, tokens = "", []
    headers = {**server.headers, "Content-Type": "application/json"}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", content=body.encode(), headers=headers,
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
                tokens += (choice.get("logprobs") or {}).get("content") or []
    return {"text": text, "tokens": tokens}


def library_reply(model: reprolm.Model, messages: list[dict[str, str]], max_tokens: int, **sampler: Any) -> str:
    return model.chat(messages, max_tokens=max_tokens, sampler=reprolm.Sampler(**sampler)).text


# ---- the page as served --------------------------------------------------------------------------


def test_the_page_is_served_without_the_key_and_fetches_nothing_from_outside(server: ServerProcess) -> None:
    r = httpx.get(f"{server.url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    # no absolute URL anywhere (HTML, CSS, JavaScript): the page works offline
    assert not re.search(r"https?:", html, flags=re.IGNORECASE)
    assert not re.search(r"//[a-z0-9.-]+\.[a-z]{2,}", html, flags=re.IGNORECASE)  # protocol-relative
    assert re.findall(r"\b(?:src|href)\s*=\s*\"([^\"]*)\"", html) == ["data:,"]
    assert "@import" not in html and not re.search(r"\burl\(", html)  # nothing loaded from CSS
    assert "innerHTML" not in html and "insertAdjacentHTML" not in html and "document.write" not in html
    # the browser may run only the page's own script and style, and talk only to this server
    policy = r.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'(;|$)", policy)
    # the page is open, the API behind it is not
    assert httpx.get(f"{server.url}/v1/models").status_code == 401


def test_no_webui_answers_404(model_path: Path, tmp_path: Path) -> None:
    assert ServerConfig(model_path=model_path).webui
    proc = ServerProcess(model_path, tmp_path / "server.log", "--no-webui", api_key=None)
    try:
        r = httpx.get(f"{proc.url}/")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert httpx.get(f"{proc.url}/v1/models").status_code == 200
    finally:
        proc.stop()


# ---- in the browser --------------------------------------------------------------------------------


def test_the_page_asks_for_the_key_and_fails_cleanly_without_it(browser: WebDriver, server: ServerProcess) -> None:
    browser.get(f"{server.url}/")
    browser.execute_script("sessionStorage.clear();")  # no key kept from another test
    browser.refresh()
    dialog = by_id(browser, "key-dialog")
    wait_for(lambda: dialog.is_displayed(), 10, "the page did not ask for the API key")
    # a wrong key is refused in the dialog
    by_id(browser, "api-key").send_keys("not-the-key")
    by_id(browser, "key-submit").click()
    wait_for(lambda: "rejected" in by_id(browser, "key-error").text, 10, "a wrong key was not refused")
    assert dialog.is_displayed()
    # without a key, a message gets the server's 401 as an error in the conversation
    by_id(browser, "key-cancel").click()
    assert not dialog.is_displayed() and "No API key" in by_id(browser, "notice").text
    reply = send(browser, "Hello?")
    assert reply.get_attribute("data-state") == "error"
    error = reply.find_element(By.CSS_SELECTOR, ".error").text
    assert error.startswith("401") and "API key" in error
    assert dialog.is_displayed()  # and the page asks again
    assert by_id(browser, "model-name").text == "\u2014"
    # with the key, it works; it is kept in this tab's sessionStorage only
    by_id(browser, "api-key").send_keys(API_KEY)
    by_id(browser, "key-submit").click()
    wait_for(lambda: not dialog.is_displayed(), 10, "the right key was not accepted")
    model_id = httpx.get(f"{server.url}/v1/models", headers=server.headers).json()["data"][0]["id"]
    assert by_id(browser, "model-name").text == model_id
    assert browser.execute_script("return sessionStorage.getItem('reprolm.apiKey');") == API_KEY
    assert browser.execute_script("return localStorage.length;") == 0
    assert page_errors(browser) == []


def test_a_reply_streams_replays_identically_and_changes_with_the_seed(
    browser: WebDriver, server: ServerProcess, model: reprolm.Model, model_path: Path
) -> None:
    open_page(browser, server)
    settings(browser, seed="1", max_tokens="24", **PLAIN)
    browser.execute_script(WATCH_STREAM)
    first = send(browser, STORY)
    assert first.get_attribute("data-state") == "done", first.text
    text = text_of(first)
    messages = [{"role": "user", "content": STORY}]
    assert text == library_reply(model, messages, 24, seed=1)
    # it streamed in: the text grew through several lengths before it was complete
    lengths = browser.execute_script("return window.__lengths;")
    growth = sorted(set(n for n in lengths if 0 < n < len(text)))
    assert len(growth) >= 3 and lengths[-1] == len(text), lengths
    fingerprint = model_fingerprint(model_path)
    assert meta(first, "seed") == "1" and meta(first, "fp") == fingerprint
    assert by_id(browser, "fingerprint").text == fingerprint
    assert meta(first, "ntokens") == "24" and meta(first, "finish") == "max tokens reached"

    marker = replay(first)
    assert marker.get_attribute("data-result") == "identical", marker.text
    assert marker.text.startswith(f"identical: {len(text.encode())} bytes")

    # another seed: regenerate replaces the reply with a different one
    settings(browser, seed="2")
    by_id(browser, "regenerate").click()
    wait_for(lambda: len(replies(browser)) == 1 and replies(browser)[0].get_attribute("data-state") == "done",
             message="regenerate did not finish")
    second = replies(browser)[0]
    assert meta(second, "seed") == "2"
    assert text_of(second) == library_reply(model, messages, 24, seed=2)
    assert text_of(second) != text
    assert replay(second).get_attribute("data-result") == "identical"
    assert page_errors(browser) == []


def test_without_a_seed_the_page_picks_one_and_the_export_reproduces_the_reply(
    browser: WebDriver, server: ServerProcess, model: reprolm.Model
) -> None:
    open_page(browser, server)
    settings(browser, seed="5", max_tokens="10", **PLAIN)
    send(browser, STORY)
    settings(browser, seed="", max_tokens="16")
    reply = send(browser, "And then?")
    seed = meta(reply, "seed")
    assert seed.isdigit()
    text = text_of(reply)
    body, link = exported_request(browser, reply)
    request = json.loads(body)
    assert request["seed"] == int(seed) and request["max_tokens"] == 16 and request["stream"] is True
    history = [m["content"] for m in request["messages"]]
    assert history == [STORY, text_of(replies(browser)[0]), "And then?"]
    # the exported bytes reproduce the reply on the server, and in the library
    assert post_streamed(server, body)["text"] == text
    assert text == library_reply(model, request["messages"], 16, seed=int(seed), temperature=1.0,
                                           top_p=1.0, top_k=0, min_p=0.0)

    # the shared link opens a page with the conversation and settings filled in: Send reproduces it
    browser.get("about:blank")
    open_page(browser, server, link)
    assert by_id(browser, "prompt").get_property("value") == "And then?"
    assert by_id(browser, "seed").get_property("value") == seed
    assert [text_of(r) for r in replies(browser)] == [history[1]]
    again = send(browser, "And then?")
    assert text_of(again) == text
    assert exported_request(browser, again)[0] == body
    assert page_errors(browser) == []


def test_the_per_token_view(browser: WebDriver, server: ServerProcess) -> None:
    open_page(browser, server)
    settings(browser, seed="7", max_tokens="20", temperature="0.9", top_p="0.95", top_k="40", min_p="0.05")
    set_checked(browser, "logprobs-on", True)
    settings(browser, top_logprobs="4")
    reply = send(browser, "Name three colours.")
    body, _ = exported_request(browser, reply)
    reference = post_streamed(server, body)["tokens"]
    assert len(reference) == int(meta(reply, "ntokens")) > 0
    marker = replay(reply)
    assert marker.get_attribute("data-result") == "identical"
    assert "log-probabilities too" in marker.text

    reply.find_element(By.CSS_SELECTOR, "button.tokens-toggle").click()
    spans = reply.find_elements(By.CSS_SELECTOR, ".tokens .tok")
    assert len(spans) == len(reference)
    assert "".join(str(s.get_property("textContent")) for s in spans) == text_of(reply)
    # coloured by probability: hue 120 p
    colours = [s.value_of_css_property("background-color") for s in spans]
    assert len(set(colours)) > 1
    # hovering a token shows its probability and its top alternatives
    ActionChains(browser).move_to_element(spans[0]).perform()
    popup = by_id(browser, "token-popup")
    wait_for(lambda: popup.is_displayed(), 5, "no popup over the token")
    first = reference[0]
    rows = popup.find_elements(By.CSS_SELECTOR, "tr")
    assert len(rows) == len(first["top_logprobs"]) == 4
    shown = [float(r.find_element(By.CSS_SELECTOR, ".p").text.rstrip("%")) for r in rows]
    assert shown == pytest.approx([100 * math.exp(a["logprob"]) for a in first["top_logprobs"]], abs=0.051)
    assert f"{first['logprob']:.4f}" in popup.find_element(By.CSS_SELECTOR, ".head").text
    # clicking pins it (here on the least likely token); the screenshot for the docs shows the page so
    ActionChains(browser).move_to_element(by_id(browser, "prompt")).perform()
    wait_for(lambda: not popup.is_displayed(), 5, "the popup stayed after the pointer left")
    spans[min(range(len(reference)), key=lambda i: reference[i]["logprob"])].click()
    wait_for(lambda: popup.is_displayed(), 5, "no popup for the clicked token")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page_errors(browser) == []


HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>'


def test_html_and_script_in_a_reply_stay_text(browser: WebDriver, server: ServerProcess) -> None:
    open_page(browser, server)
    # the JSON-schema response format makes the model write the hostile string itself
    schema = {"type": "object", "properties": {"html": {"const": HOSTILE}}, "required": ["html"],
              "additionalProperties": False}
    settings(browser, seed="1", max_tokens="80", temperature="0")
    set_checked(browser, "json-schema-on", True)
    set_value(browser, "json-schema", json.dumps(schema))
    set_checked(browser, "logprobs-on", True)
    reply = send(browser, f"Repeat this: {HOSTILE}")
    assert reply.get_attribute("data-state") == "done"
    assert json.loads(text_of(reply)) == {"html": HOSTILE}
    user = browser.find_elements(By.CSS_SELECTOR, "#conversation .msg.user")[-1]
    assert text_of(user) == f"Repeat this: {HOSTILE}"
    reply.find_element(By.CSS_SELECTOR, "button.tokens-toggle").click()
    spans = reply.find_elements(By.CSS_SELECTOR, ".tokens .tok")
    assert "".join(str(s.get_property("textContent")) for s in spans) == text_of(reply)
    ActionChains(browser).move_to_element(spans[2]).perform()
    # shown as text: no element came out of the model's or the user's text, nothing ran
    conversation = by_id(browser, "conversation")
    for tag in ("script", "img", "b"):
        assert conversation.find_elements(By.CSS_SELECTOR, f".msg {tag}") == []
        assert by_id(browser, "token-popup").find_elements(By.TAG_NAME, tag) == []
    assert browser.execute_script("return window.__pwned === undefined;")
    assert page_errors(browser) == []


def test_stop_keeps_what_came_and_its_replay_matches_it(browser: WebDriver, server: ServerProcess) -> None:
    open_page(browser, server)
    # 120 tokens (the library's reply with this seed does not end sooner): stopped long before
    settings(browser, seed="3", max_tokens="120")
    set_value(browser, "prompt", "Write a long essay about the history of Rome.")
    by_id(browser, "send").click()
    wait_for(lambda: replies(browser) and len(text_of(replies(browser)[0])) > 0, message="no text streamed in")
    by_id(browser, "stop").click()
    reply = wait_reply(browser, 1)
    assert reply.get_attribute("data-state") == "stopped" and meta(reply, "finish") == "stopped"
    assert by_id(browser, "send").is_enabled() and not by_id(browser, "stop").is_enabled()
    text = text_of(reply)
    body, _ = exported_request(browser, reply)
    whole = post_streamed(server, body)["text"]
    assert 0 < len(text) < len(whole) and whole.startswith(text)
    marker = replay(reply)
    assert marker.get_attribute("data-result") == "identical" and "up to where it was stopped" in marker.text
    assert page_errors(browser) == []


def test_every_request_went_to_the_server(browser: WebDriver, server: ServerProcess) -> None:
    open_page(browser, server)
    settings(browser, max_tokens="4")
    set_checked(browser, "logprobs-on", True)
    send(browser, "Hi")
    # Chromium's network log of everything loaded or fetched in this module's tests: (url, page)
    requests = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            params = message["params"]
            requests.append((params["request"]["url"], params.get("documentURL", "")))
    ours = [url for url, page in requests if page.startswith(f"{server.url}/")]
    assert any(u == f"{server.url}/v1/chat/completions" for u in ours)
    assert [u for u in ours if not u.startswith((f"{server.url}/", "data:", "blob:"))] == []
    # and nothing else in the browser went out on the network (its own chrome:// pages stay inside)
    assert [u for u, _ in requests if re.match(r"(https?|wss?|ftp):", u) and not u.startswith(f"{server.url}/")] == []
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    assert resources and all(str(u).startswith(f"{server.url}/") for u in resources), resources
