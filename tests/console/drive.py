"""Drives the web console in headless Chromium (Selenium, with the system's chromedriver given
explicitly, so Selenium Manager never downloads anything), against the control plane
tests/tests/console.rs started. The setup comes as JSON in the environment (QE_CONSOLE);
each check prints one line; any failure raises, and the test fails with this output.

Waits poll the page with a deadline; nothing sleeps for a fixed time.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from websockets.sync.client import connect as websocket
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

SETUP = json.loads(os.environ["QE_CONSOLE"])
BASE = SETUP["base"]
SHOTS = os.environ.get("QE_CONSOLE_SCREENSHOTS")
WITHIN = 30.0


def check(name, detail=""):
    print(f"ok {name}{': ' + detail if detail else ''}", flush=True)


def wait_for(what, probe, within=WITHIN):
    """The first truthy value of probe(), polled until the deadline."""
    deadline = time.monotonic() + within
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as error:  # an element replaced while read: try again
            last_error = error
        time.sleep(0.05)
    raise AssertionError(f"never saw {what} (last error: {last_error!r})")


def http(method, path, cookie=None, csrf=None, body=None):
    """One plain HTTP request (no browser): the status, headers and JSON body."""
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if cookie:
        headers["Cookie"] = cookie
    if csrf:
        headers["X-CSRF-Token"] = csrf
    request = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WITHIN) as response:
            text = response.read().decode()
            return response.status, response.headers, (json.loads(text) if text and text[0] in "{[" else text)
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        return error.code, error.headers, (json.loads(text) if text.startswith("{") else text)


def shot(driver, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def find(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css)


def finds(driver, css):
    return driver.find_elements(By.CSS_SELECTOR, css)


def visible(driver, css):
    elements = [e for e in finds(driver, css) if e.is_displayed()]
    return elements[0] if elements else None


def cell(driver, queue, key):
    """A number's text in the list, read in one step (the rows are redrawn on each refresh)."""
    return driver.execute_script(
        "const c = document.querySelector(`tr[data-queue=\"${arguments[0]}\"] td[data-key=\"${arguments[1]}\"]`);"
        " return c ? c.textContent : null", queue, key)


def sign_in(driver, token):
    box = wait_for("the sign-in form", lambda: visible(driver, "#token"))
    box.clear()
    box.send_keys(token)
    find(driver, "#sign-in").click()


def main():
    # The page's headers, read without the browser.
    status, headers, _ = http("GET", "/console/")
    policy = headers.get("Content-Security-Policy", "")
    assert status == 200, status
    for part in ["default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"]:
        assert part in policy, policy
    assert "unsafe-inline" not in policy, policy
    assert headers.get("X-Content-Type-Options") == "nosniff", dict(headers)
    assert headers.get("X-Frame-Options") == "DENY", dict(headers)
    status, headers, _ = http("GET", "/console/app.js")
    assert status == 200 and headers.get("Content-Type", "").startswith("text/javascript"), headers
    check("the console is served with a strict CSP, nosniff and no framing")

    options = webdriver.ChromeOptions()
    options.binary_location = SETUP["chromium"]
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,800", "--no-first-run", "--password-store=basic"]:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=SETUP["chromedriver"]), options=options)
    logs = []
    try:
        run(driver, logs)
    finally:
        driver.quit()


def browser_log(driver, logs):
    logs.extend(driver.get_log("browser"))


def run(driver, logs):
    alpha_key, alpha_queue, beta_queue = SETUP["alpha_key"], SETUP["alpha_queue"], SETUP["beta_queue"]

    driver.get(BASE + "/console/")
    wait_for("the sign-in form", lambda: visible(driver, "#token"))
    assert driver.title.startswith("Sign in"), driver.title
    find(driver, 'label[for="token"]')
    shot(driver, "sign-in")

    # A wrong key is refused, with a message.
    sign_in(driver, "qek_AAAAAAAAAAAAAAAA_not-the-secret")
    wait_for("the refusal", lambda: "not accepted" in find(driver, "#signin-error").text)
    assert not driver.get_cookies(), driver.get_cookies()
    check("a wrong key is refused with a message, and no cookie is set")

    # An account's key: its own queues only.
    sign_in(driver, alpha_key)
    wait_for("alpha's queue in the list", lambda: finds(driver, f'tr[data-queue="{alpha_queue}"]'))
    assert driver.title.startswith("Queues"), driver.title
    assert not finds(driver, f'tr[data-queue="{beta_queue}"]'), "beta's queue is listed"
    assert beta_queue not in driver.page_source
    check("an account's key shows its queue and not another account's")

    # The token is nowhere in the page.
    stored = driver.execute_script(
        "return JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie,"
        " [...document.querySelectorAll('input')].map(i => i.value), document.documentElement.outerHTML])")
    secret = alpha_key.split("_", 2)[2]
    assert alpha_key not in stored and secret not in stored, "the token is in the page"
    assert "qe_session" not in driver.execute_script("return document.cookie")
    cookie = driver.get_cookie("qe_session")
    assert cookie and cookie["httpOnly"] and cookie.get("sameSite") == "Strict" and cookie["path"] == "/", cookie
    check("the token is not in storage, cookies or the DOM; the session cookie is HttpOnly, SameSite=Strict")

    # The numbers come once the node reports (every second here): Refresh until they show.
    def depth_shown():
        text = cell(driver, alpha_queue, "waiting")
        if text not in (None, "no report") and not find(driver, "#refresh").get_attribute("disabled"):
            return text
        if not find(driver, "#refresh").get_attribute("disabled"):
            find(driver, "#refresh").click()
        return None
    depth = wait_for("the depth from the node's report", depth_shown)
    assert depth == str(SETUP["published"]), depth
    assert cell(driver, alpha_queue, "held") == "0" and cell(driver, alpha_queue, "dead_letter") == "1"
    check("the depth, in-flight and DLQ numbers appear after the node reports", f"depth {depth}")

    # A publish while the page is open: the depth changes on a refresh after the node reports.
    with websocket(SETUP["node"]) as node:
        login = SETUP["publisher"]
        node.send(json.dumps({"username": login["username"], "password": login["password"],
                              "role": "publisher", "queuetype": "distribute"}))
        assert json.loads(node.recv())["status"] == "Success."
        node.send(json.dumps({"body": "published while the page is open"}))
        assert json.loads(node.recv())["status"] == "Success."
    published = SETUP["published"] + 1
    def depth_grown():
        if find(driver, "#refresh").get_attribute("disabled"):
            return None
        if cell(driver, alpha_queue, "waiting") == str(published):
            return True
        find(driver, "#refresh").click()
        return None
    wait_for("the new depth after a refresh", depth_grown)
    depth = str(published)
    check("a publish shows in the depth on a refresh", f"depth {depth}")

    # Refresh keeps the numbers on screen (marked stale) while it loads.
    find(driver, "#refresh").click()
    during = cell(driver, alpha_queue, "waiting")
    assert during == depth, f"the numbers were blanked during a refresh: {during!r}"
    wait_for("the refresh to end", lambda: "Updated" in find(driver, "#updated").text
             and "stale" not in find(driver, "#queues").get_attribute("class"))
    assert cell(driver, alpha_queue, "waiting") == depth
    check("Refresh keeps the numbers visible while new ones load")
    shot(driver, "queues")

    # Create a queue: its three logins, shown once.
    find(driver, "#new-queue").click()
    Select(find(driver, "#new-tier")).select_by_value("devtest")
    find(driver, "#new-region").send_keys("local")
    find(driver, "#new-instance-type").send_keys("local")
    for control in ["#new-tier", "#new-region", "#new-instance-type", "#new-ipv4"]:
        find(driver, f'label[for="{control[1:]}"]')
    find(driver, "#create").click()
    panel = wait_for("the new queue's logins", lambda: visible(driver, "#logins"))
    created = panel.get_attribute("data-queue")
    assert "shown only now" in panel.text, panel.text
    passwords = [e.text for e in finds(driver, "#logins .login-password")]
    usernames = [e.text for e in finds(driver, "#logins .login-username")]
    assert len(passwords) == 3 and all(len(p) >= 16 for p in passwords), passwords
    assert len(usernames) == 3 and all(usernames), usernames
    assert len(finds(driver, "#logins button[aria-label^='Copy']")) == 7
    wait_for("the new queue in the list", lambda: finds(driver, f'tr[data-queue="{created}"]'))
    # Listed at once after its create, before its node can have reported: not known, not zero.
    assert cell(driver, created, "waiting") == "no report", cell(driver, created, "waiting")
    shot(driver, "created")
    check("a new queue shows its three logins once, with copy buttons", created)
    driver.refresh()
    wait_for("the list again", lambda: finds(driver, f'tr[data-queue="{created}"]'))
    assert not finds(driver, "#logins")
    assert not any(p in driver.page_source for p in passwords), "a password is shown again"
    check("after a reload the logins are not shown again")

    # Delete it, with a confirmation (cancel first: nothing happens).
    find(driver, f'button[data-delete="{created}"]').click()
    wait_for("the confirmation", lambda: visible(driver, "dialog[open] #confirm-cancel")).click()
    assert finds(driver, f'tr[data-queue="{created}"]')
    find(driver, f'button[data-delete="{created}"]').click()
    dialog = wait_for("the confirmation", lambda: visible(driver, "dialog[open]"))
    assert created in dialog.text, dialog.text
    find(driver, "dialog[open] #confirm-ok").click()
    wait_for("the deleted queue to leave the list", lambda: not finds(driver, f'tr[data-queue="{created}"]')
             and "Updated" in find(driver, "#updated").text, within=45)
    status, _, queue = http("GET", f"/v1/queues/{created}", cookie=f"qe_session={cookie['value']}")
    assert status == 200 and queue["status"] in ("deleted", "deleting"), (status, queue)
    check("delete asks first, then removes the queue", queue["status"])

    # Another account's queue, by its URL: not found.
    driver.get(f"{BASE}/console/#/queues/{beta_queue}/overview")
    wait_for("not found", lambda: visible(driver, "#not-found"))
    assert driver.title.startswith("Not found"), driver.title
    check("another account's queue is not found by its URL")

    # The queue page and its tabs.
    driver.get(f"{BASE}/console/#/queues/{alpha_queue}/overview")
    wait_for("the overview's numbers", lambda: visible(driver, '#overview [data-key="waiting"]'))
    assert find(driver, '#overview [data-key="waiting"] .value').text == depth
    assert find(driver, "#queue-status").text == "running"
    assert find(driver, "#queue-url").text.startswith("ws")
    assert "reported" in find(driver, "#report-age").text
    assert driver.title.startswith(f"{alpha_queue}: Overview"), driver.title
    shot(driver, "overview")
    # Keyboard: the arrow keys move between tabs.
    find(driver, "#tab-overview").send_keys("\ue014")  # ArrowRight
    wait_for("the Messages tab", lambda: find(driver, "#tab-messages").get_attribute("aria-selected") == "true")
    assert driver.switch_to.active_element.get_attribute("id") == "tab-messages"
    # Messages: through a console token and a WebSocket to the node itself.
    wait_for("the messages", lambda: len(finds(driver, "#messages-list tbody tr")) == published)
    find(driver, "#send-test").click()
    wait_for("the test message", lambda: len(finds(driver, "#messages-list tbody tr")) == published + 1)
    assert find(driver, "#node-outcome").text.startswith("Sent "), find(driver, "#node-outcome").text
    sent = find(driver, "#node-outcome").text.split()[1].rstrip(".")
    find(driver, f'#messages-list tr[data-id="{sent}"] button.show').click()
    wait_for("its payload", lambda: "A test message" in find(driver, "#payload-text").text)
    shot(driver, "messages")
    find(driver, f'#messages-list tr[data-id="{sent}"] button.delete').click()
    wait_for("it deleted", lambda: len(finds(driver, "#messages-list tbody tr")) == published)
    check("messages listed, a test message sent, shown and deleted")
    # DLQ: the dead binary message, shown in hex and base64, then redriven.
    dead = SETUP["dead"]
    find(driver, "#tab-dlq").click()
    wait_for("the dead message", lambda: len(finds(driver, f'#dlq-list tr[data-id="{dead}"]')) == 1)
    find(driver, f'#dlq-list tr[data-id="{dead}"] button.show').click()
    wait_for("its payload in hex", lambda: visible(driver, "#payload-hex"))
    assert find(driver, "#payload-hex").text == "00 01 02 ff", find(driver, "#payload-hex").text
    assert find(driver, "#payload-base64").text == "AAEC/w==", find(driver, "#payload-base64").text
    shot(driver, "dlq")
    find(driver, f'#dlq-list tr[data-id="{dead}"] button.redrive-one').click()
    wait_for("the DLQ empty after the redrive", lambda: visible(driver, "#dlq-list #empty"))
    assert find(driver, "#node-outcome").text.startswith(f"Redrove {dead}"), find(driver, "#node-outcome").text
    find(driver, "#tab-messages").click()
    wait_for("the redriven message back in the queue",
             lambda: len(finds(driver, f'#messages-list tr[data-id="{dead}"]')) == 1)
    check("DLQ: a dead binary message shown as hex and base64, redriven back to the queue")
    # Settings: a value out of range is refused with the node's code and reason.
    find(driver, "#tab-settings").click()
    wait_for("the settings", lambda: visible(driver, "#setting-saved-session-timeout-secs"))
    field = find(driver, "#setting-saved-session-timeout-secs")
    field.clear()
    field.send_keys("5")
    find(driver, "#save-saved-session-timeout-secs").click()
    wait_for("the refusal", lambda: find(driver, "#node-outcome").text.startswith("The node refused ("))
    shot(driver, "settings")
    check("settings: out of range refused", find(driver, "#node-outcome").text)
    find(driver, "#tab-monitoring").click()
    wait_for("the plots", lambda: len(finds(driver, "#charts svg.chart")) == 3)
    depth_plot = find(driver, "#charts svg.chart")
    assert "3 records" in depth_plot.get_attribute("aria-label"), depth_plot.get_attribute("aria-label")
    assert len(depth_plot.find_elements(By.TAG_NAME, "polyline")) == 4
    assert "Messages (latest 2)" in find(driver, "#charts .legend").text
    Select(find(driver, "#range")).select_by_value("7d")
    wait_for("the plots again", lambda: len(finds(driver, "#charts svg.chart")) == 3)
    shot(driver, "monitoring")
    find(driver, "#tab-api").click()
    code = wait_for("the examples", lambda: " ".join(e.text for e in finds(driver, "#tab-panel pre")))
    for example in [f"qe send {alpha_queue} --body '{{\"a\":1}}'",
                    f"qe receive {alpha_queue} --max-messages 10 --wait-seconds 5 --delete",
                    f"qe dlq redrive {alpha_queue}", "websocat ", "Publisher::connect", "from websockets",
                    'from "ws"', f"/v1/queues/{alpha_queue}"]:
        assert example in code, example
    shot(driver, "api")
    check("the queue page: overview numbers, tabs by keyboard, monitoring plots, API examples")

    # CSRF: the cookie alone makes no change; with the session's token it does.
    session_cookie = f"qe_session={cookie['value']}"
    status, _, _ = http("GET", "/v1/queues", cookie=session_cookie)
    assert status == 200, status
    new_queue = {"tier": "devtest", "region": "local", "instance_type": "local"}
    status, _, reply = http("POST", "/v1/queues", cookie=session_cookie, body=new_queue)
    assert status == 403 and "CSRF" in reply["error"]["message"], (status, reply)
    status, _, reply = http("POST", "/v1/queues", cookie=session_cookie, csrf="forged", body=new_queue)
    assert status == 403, (status, reply)
    status, _, reply = http("DELETE", "/console/session", cookie=session_cookie)
    assert status == 403, (status, reply)
    status, _, who = http("GET", "/console/session", cookie=session_cookie)
    assert status == 200 and who["caller"]["account"] == SETUP["alpha_account"], who
    status, _, reply = http("POST", "/v1/queues", cookie=session_cookie, csrf=who["csrf"], body={})
    assert status == 400, (status, reply)  # past the CSRF check: the body is what is wrong
    check("a change with the cookie but without the CSRF token is refused (403)")

    # The phone-sized screen: nothing wider than the screen.
    driver.set_window_size(390, 844)
    driver.get(BASE + "/console/#/")
    # The redriven message waits again beside the published ones.
    back = str(published + 1)
    wait_for("the list", lambda: cell(driver, alpha_queue, "waiting") == back)
    width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    assert find(driver, f'tr[data-queue="{alpha_queue}"] a').is_displayed()
    shot(driver, "phone-queues")
    driver.get(f"{BASE}/console/#/queues/{alpha_queue}/api")
    wait_for("the examples", lambda: finds(driver, "#tab-panel pre"))
    width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    shot(driver, "phone-api")
    driver.set_window_size(1280, 800)
    check("at 390x844 the list and a queue page do not overflow sideways")

    # Sign out: the cookie no longer works.
    find(driver, "#sign-out").click()
    wait_for("the sign-in form", lambda: visible(driver, "#token"))
    status, _, _ = http("GET", "/v1/queues", cookie=session_cookie)
    assert status == 401, status
    status, _, who = http("GET", "/console/session", cookie=session_cookie)
    assert who == {"caller": None}, who
    check("sign-out ends the session: its cookie is refused")

    # A read-only key: the console offers no change, and the API refuses one.
    sign_in(driver, SETUP["reader_key"])
    wait_for("the list", lambda: finds(driver, f'tr[data-queue="{alpha_queue}"]'))
    assert not finds(driver, "#new-queue") and not finds(driver, "button[data-delete]")
    reader_cookie = f"qe_session={driver.get_cookie('qe_session')['value']}"
    _, _, who = http("GET", "/console/session", cookie=reader_cookie)
    status, _, reply = http("POST", "/v1/queues", cookie=reader_cookie, csrf=who["csrf"], body=new_queue)
    assert status == 403 and "read-only" in reply["error"]["message"], (status, reply)
    check("a read-only key's session offers no change and is refused one")

    # No console errors but the refusals the test asked for.
    browser_log(driver, logs)
    expected = ["/console/session - Failed to load resource: the server responded with a status of 401",
                f"/v1/queues/{beta_queue} - Failed to load resource: the server responded with a status of 404"]
    errors = [entry for entry in logs if entry["level"] == "SEVERE"
              and not any(e in entry["message"] for e in expected)]
    assert not errors, errors
    check("no console errors (CSP violations, exceptions, failed loads) but the expected refusals",
          f"{len(logs)} entries")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"FAILED: {error}", flush=True)
        raise
    sys.exit(0)
