"""The operator page's search box and error groups in a real browser (headless Chromium, as
tests/e2e/test_operator_page.py): a customer's orders found newest first, the Error orders
grouped by cause, and the group resubmitted from its button once the cause is fixed."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from core.models import ProcessState
from devtools.orders import order_json
from tests.e2e.test_operator_page import ARTIFACTS, Page, browser  # noqa: F401 - browser is a fixture
from tests.polling import wait_until

CUSTOMER = ["k-1", "k-2", "k-3"]
FAILING = ["k-e1", "k-e2"]


def test_a_customer_search_and_a_group_resubmit_from_the_operator_page(stack, browser):  # noqa: F811
    # k-e1, k-e2: shipping refuses and inventory refuses the release: Error, one cause.
    stack.remote.set_faults(
        script={f"{o}/{action}": ["always:permanent"] for o in FAILING for action in ("ship", "release")})
    (host,) = stack.start_hosts(API_AUTH="none", STEP_TIMEOUT_SECONDS="20")  # no late refusal taken for lost
    for order_id in CUSTOMER:  # one after the other: their creation times are their order
        stack.send([(order_id, order_json(order_id, customer_id="cust-page"))])
        wait_until(lambda: stack.state(order_id), timeout=30, what=f"{order_id} to be created")
    stack.send([(o, order_json(o, customer_id="cust-other")) for o in FAILING])
    stack.wait_closed(CUSTOMER + FAILING, timeout=60)
    artefacts = ARTIFACTS.parent / "operator-search"
    artefacts.mkdir(parents=True, exist_ok=True)
    page = Page(browser, artefacts)
    browser.get(f"{host.http_url}/api/ops")

    # The search box: the customer's orders, newest first, each opening its timeline.
    field = browser.find_element(By.ID, "customer-input")
    field.send_keys("cust-page")
    browser.find_element(By.CSS_SELECTOR, "#customer-form button[type=submit]").click()
    page.until(lambda: page.listed("customer-orders") == CUSTOMER[::-1], "cust-page's orders, newest first")
    assert "Processed" in page.read(lambda: page.row("customer-orders", "k-1").text)
    field.clear()
    field.send_keys("nobody")
    browser.find_element(By.CSS_SELECTOR, "#customer-form button[type=submit]").click()
    page.until(lambda: browser.find_element(By.ID, "customer-empty").is_displayed(), "an empty answer")
    page.screenshot("customer-search")

    # One group of two, with its button; the operator fixes the cause and resubmits the group.
    groups = lambda: browser.find_elements(By.CSS_SELECTOR, "#error-groups tbody tr")  # noqa: E731
    page.until(lambda: [r.get_attribute("data-count") for r in groups()] == ["2"], "one group of 2")
    assert "HTTP 422" in page.read(lambda: groups()[0].text)
    page.screenshot("error-groups")
    stack.remote.set_faults(service="inventory", script=None)
    page.click(lambda: groups()[0].find_element(By.CSS_SELECTOR, "button.resubmit-group"), "the group's button")
    page.until(lambda: groups() == [] and browser.find_element(By.ID, "error-groups-empty").is_displayed(),
               "the group to empty")
    states = stack.wait_closed(FAILING, timeout=30)
    assert {s.process_state for s in states.values()} == {ProcessState.COMPENSATED}
    assert page.read(lambda: browser.find_element(By.ID, "problem").text) == ""
    stack.assert_remote_clean()
