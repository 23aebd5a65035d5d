"""The operator page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``make test`` installs when it runs as root; nothing is
downloaded by the driver) loads ``/api/ops`` from a local host running the real
function_app.py, after orders ran through the whole local stack: it shows the counts per
state, the orders in Error and in Compensated, one order's timeline drawn from its trace
(steps, attempts, calls, hosts), and a resubmit of the Error order, once its cause is
fixed, moves it on; an order still in flight is cancelled from its timeline. Screenshots are kept as test artefacts (the folder is printed).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from core.models import ProcessState
from devtools.orders import order_json
from tests import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver"
#: Where the screenshots go: TEST_ARTIFACTS_DIR, else test-artifacts/ (git-ignored).
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or ROOT / "test-artifacts") / "operator-page"
#: The page refreshes every 3 s; a state it must reach gets a few refreshes and the stack's time.
WAIT = 30


@pytest.fixture
def browser(tmp_path):
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"the operator page test needs Debian's Chromium and its driver; missing: {', '.join(missing)}. "
            f"`make test` installs them when run as root; or: sudo sh -c '{INSTALL}'",
            pytrace=False,
        )
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, if anything asked it, downloads nothing
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,2000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The operator page as the test reads it: by the ids and data attributes ops.js sets."""

    def __init__(self, driver, artefacts: Path) -> None:
        self.driver = driver
        self.artefacts = artefacts
        self.shots = 0

    def until(self, check, what: str, timeout: float = WAIT):
        def attempt(_):
            try:
                return check()
            except StaleElementReferenceException:  # redrawn under us: read again
                return None

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(attempt, message=what)
        except WebDriverException:
            self.screenshot("failed")
            problem = self.driver.find_element(By.ID, "problem").text
            logs = "\n".join(entry["message"] for entry in self.driver.get_log("browser"))
            raise AssertionError(f"timed out waiting for {what}; page problem: {problem!r}; console:\n{logs}") from None

    def read(self, read, what: str = "the page"):
        """``read()``'s value, read again if the page redrew what it was reading (every 3 s)."""
        return self.until(lambda: (read(),), what)[0]

    def click(self, locate, what: str) -> None:
        """Click the element ``locate()`` finds, found again if the page redrew it."""
        self.until(lambda: locate().click() or True, what)

    def screenshot(self, name: str) -> Path:
        self.shots += 1
        path = self.artefacts / f"{self.shots:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def count(self, state: str) -> str:
        return self.driver.find_element(By.CSS_SELECTOR, f'td[data-count="{state}"]').text

    def counts(self, **expected: int) -> bool:
        return all(self.count(state) == str(n) for state, n in expected.items())

    def listed(self, table: str) -> list[str]:
        rows = self.driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
        return [row.get_attribute("data-order-id") for row in rows]

    def row(self, table: str, order_id: str):
        return self.driver.find_element(By.CSS_SELECTOR, f'#{table} tbody tr[data-order-id="{order_id}"]')

    def open_timeline(self, order_id: str) -> None:
        def ask() -> bool:
            field = self.driver.find_element(By.ID, "order-input")
            field.clear()
            field.send_keys(order_id)
            self.driver.find_element(By.CSS_SELECTOR, "#order-form button[type=submit]").click()
            return True

        self.until(ask, f"asking for {order_id}'s timeline")

    def steps(self) -> dict[tuple[str, str], dict[str, str]]:
        """The timeline's step table: (step, kind) -> column -> text."""
        heads = [th.text for th in self.driver.find_elements(By.CSS_SELECTOR, "#timeline-steps thead th")]
        found = {}
        for row in self.driver.find_elements(By.CSS_SELECTOR, "#timeline-steps tbody tr"):
            cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            found[(row.get_attribute("data-step"), row.get_attribute("data-kind"))] = dict(zip(heads, cells))
        return found

    def spans(self) -> list[dict[str, str]]:
        return [
            {key: row.get_attribute(f"data-{key}") or "" for key in ("name", "step", "attempt", "host")}
            for row in self.driver.find_elements(By.CSS_SELECTOR, "#timeline-spans .span-row")
        ]


def test_the_operator_page_in_a_browser(stack, browser):
    # o-p1, o-p2: Processed. o-c: shipping refuses, the charge is refunded and the stock
    # released: Compensated. o-e: as o-c, but inventory refuses the release: Error.
    # o-w (sent last): its charge keeps failing, so it stays in flight until it is cancelled.
    stack.remote.set_faults(script={"o-c/ship": ["permanent"], "o-e/ship": ["permanent"],
                                    "o-e/release": ["permanent"], "o-w/charge": ["always:transient"]})
    # Room for o-w's failing charge (10 attempts); no other order here fails by timing out.
    (host,) = stack.start_hosts(API_AUTH="none", MAX_FAILURES="10")
    ids = ["o-p1", "o-p2", "o-c", "o-e"]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_closed(ids, timeout=60)
    assert [states[i].process_state for i in ids] == [
        ProcessState.PROCESSED, ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.ERROR,
    ]
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    print(f"\nscreenshots of the operator page: {ARTIFACTS}")
    page = Page(browser, ARTIFACTS)

    browser.get(f"{host.http_url}/api/ops")
    assert browser.title == "Orders: operator page"
    # The counts per state, and the orders in Error and Compensated with their last error.
    page.until(lambda: page.counts(Processed=2, Compensated=1, Error=1, Pending=0, Processing=0), "the counts")
    page.until(lambda: page.listed("error-orders") == ["o-e"] and page.listed("compensated-orders") == ["o-c"],
               "the Error and Compensated lists")
    assert "no sign-in" in page.read(lambda: browser.find_element(By.ID, "who").text)
    assert "refused" in page.read(lambda: page.row("error-orders", "o-e").text)  # its last error
    assert "ship" in page.read(lambda: page.row("compensated-orders", "o-c").text)
    # The operator (no auth locally: everyone) gets a resubmit button on the Error order only.
    assert page.read(lambda: page.row("error-orders", "o-e").find_elements(By.CSS_SELECTOR, "button.resubmit"))
    assert not page.read(
        lambda: page.row("compensated-orders", "o-c").find_elements(By.CSS_SELECTOR, "button.resubmit")
    )
    assert page.read(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart canvas")), "no chart drawn"
    page.screenshot("counts-and-lists")

    # One order's timeline, from its trace: every step with its attempt and host.
    instance = stack.claims("o-p1")[0].instance
    page.open_timeline("o-p1")
    page.until(lambda: {s["name"] for s in page.spans()} >= {"order.submit", "order.claim", "agent.run",
                                                             "POST /reserve", "POST /ship", "order.close"},
               "o-p1's spans")
    steps = page.read(page.steps)
    assert [(key, row["state"]) for key, row in steps.items()] == [
        (("reserve", "action"), "Done"), (("charge", "action"), "Done"), (("ship", "action"), "Done"),
    ]
    for row in steps.values():
        assert (row["attempts"], row["calls"], row["hosts"]) == ("1", "1", instance[:8]), row
    claims = [(s["step"], s["attempt"], s["host"]) for s in page.read(page.spans) if s["name"] == "order.claim"]
    # "#n" is the order's attempt counter (the fencing token): one more per claim.
    assert claims == [("reserve", "1", instance[:8]), ("charge", "2", instance[:8]), ("ship", "3", instance[:8])]
    assert "Processed" in page.read(lambda: browser.find_element(By.ID, "timeline-state").text)
    assert re.search(r"\d+ spans in 1 trace", page.read(lambda: browser.find_element(By.ID, "timeline-summary").text))
    page.screenshot("timeline-processed")

    # The Compensated order's timeline, opened from its list: the undos, newest first.
    page.click(lambda: page.row("compensated-orders", "o-c").find_element(By.CSS_SELECTOR, "button.show-timeline"),
               "o-c's timeline button")
    page.until(lambda: ("charge", "compensation") in page.steps() and "POST /release" in {
        s["name"] for s in page.spans()}, "o-c's compensations")
    compensated = page.read(page.steps)
    assert compensated[("ship", "action")]["state"] == "Refused"
    assert [key for key in compensated if key[1] == "compensation"] == [("charge", "compensation"),
                                                                         ("reserve", "compensation")]
    assert all(compensated[key]["state"] == "Done" for key in compensated if key[1] == "compensation")
    page.screenshot("timeline-compensated")

    # The operator fixes the cause (inventory takes the release now) and resubmits from the
    # page: the order leaves Error and ends Compensated, its release done.
    stack.remote.set_faults(service="inventory", script=None)
    page.click(lambda: page.row("error-orders", "o-e").find_element(By.CSS_SELECTOR, "button.resubmit"),
               "o-e's resubmit button")
    page.until(lambda: page.listed("error-orders") == [] and "o-e" in page.listed("compensated-orders"),
               "o-e to move from Error to Compensated")
    page.until(lambda: page.counts(Processed=2, Compensated=2, Error=0), "the counts after the resubmit")
    # The page opened o-e's timeline on the resubmit: the resubmit and the release, in its one trace.
    page.until(lambda: browser.find_element(By.ID, "timeline").get_attribute("data-order-id") == "o-e"
               and page.steps().get(("reserve", "compensation"), {}).get("state") == "Done"
               and {"order.resubmit", "POST /release"} <= {s["name"] for s in page.spans()},
               "o-e's timeline with the resubmit and its release done")
    assert re.search(r"\d+ spans in 1 trace", page.read(lambda: browser.find_element(By.ID, "timeline-summary").text))
    assert stack.wait_closed(["o-e"], timeout=30)["o-e"].process_state is ProcessState.COMPENSATED
    page.screenshot("after-resubmit")
    assert page.read(lambda: browser.find_element(By.ID, "problem").text) == ""
    assert not page.read(lambda: browser.find_element(By.ID, "cancel-form").is_displayed())  # o-e has ended

    # An order in flight: the operator cancels it from its timeline, with a reason.
    stack.send([("o-w", order_json("o-w"))])
    stack.capture("o-w", "charge")
    page.open_timeline("o-w")
    page.until(lambda: browser.find_element(By.ID, "cancel-form").is_displayed(), "o-w's cancel button")
    browser.find_element(By.ID, "cancel-reason").send_keys("customer called")
    page.click(lambda: browser.find_element(By.ID, "cancel-order"), "o-w's cancel button")
    page.until(lambda: "customer called" in browser.find_element(By.ID, "timeline-cancelled").text
               and not browser.find_element(By.ID, "cancel-form").is_displayed(), "o-w's cancel shown")
    cancelled = stack.wait_closed(["o-w"], timeout=60)["o-w"]
    assert cancelled.process_state is ProcessState.COMPENSATED and "customer called" in cancelled.cause
    page.until(lambda: "o-w" in page.listed("compensated-orders")
               and "Compensated" in browser.find_element(By.ID, "timeline-state").text, "o-w Compensated")
    page.screenshot("after-cancel")
    assert page.read(lambda: browser.find_element(By.ID, "problem").text) == ""

    # An action's error stays on the page through the refreshes (every 3 s, each redrawing
    # the open timeline), until the next action: a search for a customer id that is none.
    browser.find_element(By.ID, "customer-input").send_keys("not a customer?")
    page.click(lambda: browser.find_element(By.CSS_SELECTOR, "#customer-form button[type=submit]"), "the search button")
    page.until(lambda: "customer not a customer?" in browser.find_element(By.ID, "problem").text, "the search's error")
    seen = page.read(lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed")))
    page.until(lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed")) > seen + 3000,
               "two refreshes after the search", timeout=20)
    assert "customer not a customer?" in page.read(lambda: browser.find_element(By.ID, "problem").text)

    # Traces sampled as the Bicep deploys them (one order in 100 kept; here none, by trace id, as
    # Application Insights' fixed-percentage sampler decides): a host that keeps no span.
    # A failed order is still explained: the page's steps, attempts and errors come from the
    # state store, and the host log (Application Insights' traces, in Azure) keeps its record.
    assert host.terminate() == 0
    (sampled,) = stack.start_hosts(API_AUTH="none", OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
    stack.remote.set_faults(script={"o-s/ship": ["permanent"]})
    stack.send([("o-s", order_json("o-s"))])
    assert stack.wait_closed(["o-s"], timeout=60)["o-s"].process_state is ProcessState.COMPENSATED
    browser.get(f"{sampled.http_url}/api/ops")
    page.open_timeline("o-s")
    page.until(lambda: "no spans kept" in browser.find_element(By.ID, "timeline-summary").text
               and ("charge", "compensation") in page.steps(), "o-s's timeline from the state store")
    steps = page.read(page.steps)
    assert steps[("ship", "action")]["state"] == "Refused"
    assert all(steps[key]["state"] == "Done" for key in (("charge", "compensation"), ("reserve", "compensation")))
    assert "Compensated" in page.read(lambda: browser.find_element(By.ID, "timeline-state").text)
    record = sampled.wait_for_log(r"\[Function\.complete_step\.User\] order o-s ended Compensated at .*").group(0)
    trace_id = stack.state("o-s").trace_parent.split("-")[1]
    assert "refused" in record and f"trace {trace_id}" in record
    assert stack.spans("o-s") == []
    page.screenshot("timeline-sampled-out")
    stack.assert_remote_clean()
