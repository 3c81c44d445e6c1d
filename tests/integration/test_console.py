"""The operator console (broker/console/, served at /console/) in a real headless browser
(Debian's chromium driven through its chromedriver by Selenium; nothing downloaded),
against a real broker: the overview lists a topic the official client produced to with
its backlog; the topic page shows the subscription's backlog and who holds unacked
messages; "Skip all" and "Reset to min ago" clicked on the page move the cursor (the
admin REST confirms); "Peek" shows the next message; the cluster page lists the
bookies and the under-replicated count. A page opened after the fact draws the history
the broker kept (broker/stats_history.py) and says since when a subscription falls
behind. With authentication on, the page shows the broker's refusal until a token is
given, then the data.

MAGNETAR_CONSOLE_SCREENSHOTS=<dir> saves the pages as PNGs there (docs/ has them).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from tests.cluster import http_json, unique, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20.0


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert shutil.which("chromium") and os.path.exists(CHROMEDRIVER), \
        "chromium and chromedriver are missing: run `make setup` (Debian's chromium and chromium-driver)"
    os.environ["SE_OFFLINE"] = "true"   # Selenium Manager must not fetch drivers or browsers
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for(driver, predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            value = predicate(driver)
        except Exception:   # an element replaced by a refresh between find and read
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"the page did not show {what} within {WAIT_S:g} s; " \
                                            f"status: {driver.find_element('id', 'status').text!r}"
        time.sleep(0.2)


def _text_of(driver, selector: str) -> str:
    return driver.find_element("css selector", selector).text


def _screenshot(driver, name: str) -> None:
    directory = os.environ.get("MAGNETAR_CONSOLE_SCREENSHOTS")
    if directory:
        driver.save_screenshot(os.path.join(directory, f"console-{name}.png"))


def _backlog(admin: str, path: str, subscription: str) -> int:
    return http_json("GET", f"{admin}/admin/v2/{path}/stats")["subscriptions"][subscription]["msgBacklog"]


async def test_console_shows_backlog_and_moves_a_cursor(cluster, browser):
    """The pages show the produced topic's backlog and who holds unacked messages; skip
    all, reset cursor and peek work from the page; the cluster page lists bookies."""
    import pulsar

    await cluster.start_bookies(2)
    # A quick history, so that the screenshots show its charts.
    (broker,) = await cluster.start_brokers(1, extra_args=["--stats-history-interval-s", "0.5"])
    admin = broker.web_service_url
    name = unique("console")
    topic, path = f"persistent://public/default/{name}", f"persistent/public/default/{name}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "sub").close()
        holder = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared,
                                  consumer_name="holder")
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(30):
            producer.send(f"m-{index}".encode())
        for _ in range(4):
            holder.receive(timeout_millis=10_000)   # held unacknowledged
        time.sleep(0.5)   # the client's prefetch settles

        browser.get(f"{admin}/console/")
        row = f'tr[data-topic="{topic}"]'
        _wait_for(browser, lambda d: _text_of(d, f'{row} td[data-field="backlog"]') == str(30 + 30),
                  "the topic with its backlog of 60 (two subscriptions of 30)")
        assert "public/default:" in _text_of(browser, 'li[data-namespace="public/default"]')
        _screenshot(browser, "topics")
        browser.find_element("css selector", f"{row} a").click()
        sub_row = 'tr[data-subscription="sub"]'
        _wait_for(browser, lambda d: _text_of(d, f'{sub_row} td[data-field="backlog"]') == "30",
                  "the subscription's backlog of 30")
        # What the broker dispatched to the holder and was not acknowledged (the 4 it
        # received and what its client prefetched), as the admin REST counts it.
        unacked = http_json("GET", f"{admin}/admin/v2/{path}/stats")["subscriptions"]["work"]["unackedMessages"]
        assert unacked >= 4
        _wait_for(browser, lambda d: f"holder: {unacked} unacked" in _text_of(d, 'tr[data-subscription="work"]'),
                  f"the consumer holding {unacked} unacked messages")
        _screenshot(browser, "topic")

        browser.find_element("css selector", f'{sub_row} button[data-action="skip-all"]').click()
        _wait_for(browser, lambda d: _backlog(admin, path, "sub") == 0, "the skip to take effect (admin REST)")
        _wait_for(browser, lambda d: _text_of(d, f'{sub_row} td[data-field="backlog"]') == "0", "backlog 0")

        minutes = browser.find_element("css selector", f'{sub_row} input[data-field="reset-minutes"]')
        minutes.clear()
        minutes.send_keys("60")
        browser.find_element("css selector", f'{sub_row} button[data-action="reset"]').click()
        _wait_for(browser, lambda d: _backlog(admin, path, "sub") == 30, "the reset to take effect (admin REST)")
        _wait_for(browser, lambda d: _text_of(d, f'{sub_row} td[data-field="backlog"]') == "30", "backlog 30")

        browser.find_element("css selector", f'{sub_row} button[data-action="peek"]').click()
        _wait_for(browser, lambda d: "m-0" in _text_of(d, "#peek"), "the peeked first message")

        browser.get(f"{admin}/console/#/cluster")
        _wait_for(browser, lambda d: len(d.find_elements("css selector", "tr[data-bookie]")) == 2, "two bookies")
        assert _text_of(browser, "#under-replicated").startswith("0 ledgers")
        _screenshot(browser, "cluster")
        producer.close()
        holder.close()
    finally:
        client.close()


async def test_console_draws_the_history_the_broker_kept(cluster, browser):
    """Produced without consuming while no page was open, on two brokers sampling every
    0.5 s: the console opened afterwards, on the broker that does NOT serve the topic
    (its requests are answered through that broker: broker/admin/forward.py), draws the
    backlog chart from the serving broker's history (at least the samples taken before
    the page was opened, so not from its own) and shows since when the subscription
    falls behind, in the topic list, the topic's header and the subscription's row, at
    the time the admin REST gives."""
    import pulsar

    await cluster.start_bookies(2)
    brokers = await cluster.start_brokers(2, extra_args=["--stats-history-interval-s", "0.5",
                                                         "--stats-history-window-s", "120"])
    name = unique("history")
    topic, path = f"persistent://public/default/{name}", f"persistent/public/default/{name}"
    # The history lives on the serving broker (the CLI's urllib follows the 307 there).
    admin = brokers[0].web_service_url
    client = pulsar.Client(brokers[0].service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "slow").close()       # a subscription nobody consumes
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(5):                            # a backlog growing over a few samples
            for index in range(4):
                producer.send(f"m-{index}".encode())
            time.sleep(0.6)
        producer.close()

        def grown() -> dict | None:
            answer = http_json("GET", f"{admin}/admin/v2/{path}/statsHistory")
            slow = answer["subscriptions"].get("slow")
            return answer if slow and slow["msgBacklog"][-1] == 20 and len(answer["timestamps"]) >= 8 else None

        history = wait_until(grown, 20, "8 samples with the backlog of 20 in the broker's history")
        since = history["subscriptions"]["slow"]["behindSince"]
        assert since is not None and history["behindSince"] == since and history["behindSubscription"] == "slow"
        backlogs = history["subscriptions"]["slow"]["msgBacklog"]
        assert backlogs == sorted(backlogs) and backlogs[0] < 20, backlogs   # it grew while sampled
        assert since == history["timestamps"][history["subscriptions"]["slow"]["firstSampleIndex"]
                                              + next(i for i, b in enumerate(backlogs) if b > 0)]
        samples_before = len(history["timestamps"])
        serving = http_json("GET", f"{admin}/lookup/v2/topic/{path}")["httpUrl"]
        (elsewhere,) = [b.web_service_url for b in brokers if b.web_service_url != serving]

        browser.get(f"{elsewhere}/console/")
        row = f'tr[data-topic="{topic}"]'
        cell = f'{row} td[data-field="behind-since"] span'
        _wait_for(browser, lambda d: d.find_element("css selector", cell).get_attribute("data-since") == str(since),
                  "the topic's 'falling behind since' in the topic list")
        assert _text_of(browser, cell).startswith("falling behind since ") and _text_of(browser, cell).endswith(": slow")
        browser.find_element("css selector", f"{row} a").click()

        def points(series: str) -> int:
            return int(browser.find_element("css selector", f'#history svg[data-series="{series}"]')
                       .get_attribute("data-points"))

        _wait_for(browser, lambda d: points("msgBacklog") >= samples_before,
                  f"a backlog chart of at least the {samples_before} samples taken before the page was opened")
        assert points("msgRateIn") >= samples_before - 1       # no rate at the first sample
        assert "backlog (entries) (max 20)" in _text_of(browser, "#history")
        behind = browser.find_element("css selector", "#topic-behind span")
        assert behind.get_attribute("data-since") == str(since) and "falling behind since" in behind.text
        sub_cell = browser.find_element("css selector", 'tr[data-subscription="slow"] td[data-field="behind-since"]')
        assert sub_cell.find_element("css selector", "span").get_attribute("data-since") == str(since)
        assert int(sub_cell.find_element("css selector", "svg").get_attribute("data-points")) >= len(backlogs)
        _screenshot(browser, "history")
    finally:
        client.close()


async def test_console_needs_the_token_the_admin_api_needs(cluster, browser, tmp_path):
    """Authentication and authorization on (bookies open, the broker checking tokens):
    without a token the page shows the broker's 401; with a token of a role that is no
    superuser, the tenants list is refused (403) and shown as such; with a superuser's,
    the topics appear."""
    from runtime.tokens import TokenSigner, create_secret_key

    key = create_secret_key()
    key_path = tmp_path / "secret.key"
    key_path.write_bytes(key)
    signer = TokenSigner.with_secret_key(key)
    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1, extra_args=[
        "--authentication-enabled", "--authorization-enabled", "--superuser-roles", "ops-admin",
        "--token-secret-key", f"file://{key_path}"])
    browser.get(f"{broker.web_service_url}/console/")
    _wait_for(browser, lambda d: "401" in _text_of(d, "#status"), "the broker's 401 without a token")

    def use_token(token: str) -> None:
        field = browser.find_element("id", "token")
        field.clear()
        field.send_keys(token)
        browser.find_element("css selector", "#token-form button").click()

    use_token(signer.create("someone"))
    _wait_for(browser, lambda d: "403" in _text_of(d, "#status"), "the broker's 403 for a role that is no superuser")
    assert not browser.find_elements("css selector", "tr[data-topic]")
    use_token(signer.create("ops-admin"))
    _wait_for(browser, lambda d: d.find_elements("css selector", "table#topics") and
              "updated" in _text_of(d, "#status"), "the topics table for the superuser")
