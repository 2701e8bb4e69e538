"""Drives the web console in headless Chromium (Playwright for Python, sync API, launching the
system's Chromium by its path, so no browser is ever downloaded: `playwright install` is never
run), against the control plane tests/tests/console.rs started. The setup comes as JSON in the
environment (QE_CONSOLE); each check prints one line; any failure raises, and the test fails
with this output. QE_CONSOLE_SCREENSHOTS=DIR saves a screenshot of each page it visits (a
relative DIR is taken from the workspace's root, so docs/console is the README's folder).

Waits are Playwright's own (`expect` and actions that wait until the page is ready), each with
a deadline; nothing sleeps for a fixed time.
"""

import datetime
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

import boto3
import botocore.config
from botocore.exceptions import ClientError
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect, sync_playwright

SETUP = json.loads(os.environ["QE_CONSOLE"])
BASE = SETUP["base"]
WORKSPACE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHOTS = os.environ.get("QE_CONSOLE_SCREENSHOTS")
if SHOTS:
    SHOTS = os.path.join(WORKSPACE, SHOTS)  # an absolute SHOTS stays as it is
WITHIN = 30.0
WIDE = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def check(name, detail=""):
    print(f"ok {name}{': ' + detail if detail else ''}", flush=True)


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


def stats_records(key, queue):
    """The queue's stats records of the last 24 hours through the API (as the Monitoring tab
    asks for them), oldest first."""
    now = int(time.time())
    day = lambda secs: datetime.datetime.fromtimestamp(secs, datetime.timezone.utc).strftime("%Y-%m-%d")
    request = urllib.request.Request(
        f"{BASE}/v1/stats?from={day(now - 86400)}&to={day(now)}&queue={queue}",
        headers={"Accept": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=WITHIN) as response:
        stats = json.loads(response.read().decode())["stats"]
    return sorted((r for r in stats if now - 86400 <= r["time"] <= now), key=lambda r: r["time"])


def shot(page, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))


def cell(page, queue, key):
    """A number's text in the list, read in one step (the rows are redrawn on each refresh)."""
    return page.evaluate(
        "([queue, key]) => { const c = document.querySelector("
        "`tr[data-queue=\"${queue}\"] td[data-key=\"${key}\"]`); return c ? c.textContent : null }",
        [queue, key])


def row(page, queue):
    return page.locator(f'tr[data-queue="{queue}"]')


def refresh_until(page, what, done, within=WITHIN):
    """Clicks Refresh, each time after its last load has ended, until done() gives a truthy
    value (returned) or the deadline passes. The button is disabled while a load runs."""
    deadline = time.monotonic() + within
    refresh = page.locator("#refresh")
    while True:
        expect(refresh).to_be_enabled(timeout=max(deadline - time.monotonic(), 1) * 1000)
        value = done()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what} (last read: {value!r})")
        refresh.click()


def cookie_of(context, name):
    cookies = [c for c in context.cookies() if c["name"] == name]
    return cookies[0] if cookies else None


def qe_send(queue, body):
    """`qe send` with a profile of its own: the account's key, then the queue's publisher."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, QE_CONFIG=os.path.join(home, "config.toml"))
        env.pop("QE_PROFILE", None)
        env.pop("QE_TOKEN", None)

        def qe(*arguments, stdin=""):
            done = subprocess.run([SETUP["qe"], *arguments], input=stdin, env=env,
                                  capture_output=True, text=True, timeout=WITHIN)
            assert done.returncode == 0, (arguments, done.stdout, done.stderr)
            return done.stdout

        qe("login", "--api", BASE, "--token-stdin", stdin=SETUP["alpha_key"] + "\n")
        login = SETUP["publisher"]
        qe("queues", "login", queue, "--role", "publisher", "--username", login["username"],
           "--password-stdin", "--url", SETUP["node"], stdin=login["password"] + "\n")
        return qe("send", queue, "--body", body)


def sqs_client(endpoint, key_id, secret):
    """boto3 for the node's SQS face, with a key the page showed (no retries: a refusal is
    the answer)."""
    return boto3.client("sqs", endpoint_url=endpoint, region_name="eu-west-1",
                        aws_access_key_id=key_id, aws_secret_access_key=secret,
                        config=botocore.config.Config(retries={"max_attempts": 0}, read_timeout=WITHIN))


def sqs_refusal(call):
    """The SQS error code `call` fails with."""
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the SQS call succeeded")


def no_overflow(page):
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width


def sqs_tab(page, session_cookie, queue):
    """The SQS tab: a subscriber key made, its secret shown once and served by the node, then
    revoked (asked first); a key revoked behind the page's back shows the API's error."""
    expect(page).to_have_title(re.compile("^" + re.escape(f"{queue}: SQS")))
    endpoint = page.locator("#sqs-endpoint")
    expect(endpoint).to_have_text(re.compile(r"^http://127\.0\.0\.1:\d+$"))
    endpoint = endpoint.inner_text()
    expect(page.locator("#sqs-queue-url")).to_have_text(f"{endpoint}/{queue}")
    expect(page.locator("#no-sqs-keys")).to_be_visible()

    new_key = page.locator("#new-sqs-key")
    new_key.click()
    expect(new_key).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#sqs-role")).to_be_focused()
    expect(page.locator('label[for="sqs-role"]')).to_be_attached()
    page.locator("#sqs-role").select_option("subscriber")
    page.locator("#make-sqs-key").click()
    made = page.locator("#sqs-new-key")
    expect(made).to_be_visible()
    expect(made).to_contain_text("shown only now")
    expect(page.locator("#sqs-new-key-title")).to_be_focused()
    # Until it is saved, no other key can replace it.
    expect(page.locator("#make-sqs-key")).to_have_count(0)
    expect(new_key).to_be_disabled()
    key_id = page.locator("#sqs-new-key-id").inner_text()
    secret = page.locator("#sqs-new-secret").inner_text()
    assert re.fullmatch(r"QE[A-Z2-7]{18}", key_id) and made.get_attribute("data-key-id") == key_id, key_id
    assert len(secret) >= 20, secret
    expect(page.locator("#sqs-new-applied [data-applied]")).to_have_text("applied")
    expect(page.locator("#sqs-new-applied")).to_contain_text("the node serves it")
    expect(made.locator("button[aria-label^='Copy']")).to_have_count(5)  # id, secret, exports, 2 examples
    python, cli = made.locator("pre").all_inner_texts()
    compile(python, "the boto3 example", "exec")
    code = f"{python}\n{cli}"
    for example in [f'aws_access_key_id="{key_id}"', f'url = "{endpoint}/{queue}"', "sqs.receive_message(",
                    f"AWS_ACCESS_KEY_ID={key_id}",
                    f"aws sqs receive-message --queue-url {endpoint}/{queue} --wait-time-seconds 5 "
                    f"--endpoint-url {endpoint}"]:
        assert example in code, (example, code)
    assert secret not in code, "the examples hold the secret"
    listed = page.locator(f'#sqs-keys tr[data-key-id="{key_id}"]')
    expect(listed).to_have_attribute("data-state", "active")
    expect(listed).to_contain_text("subscriber")
    # What the page showed is a real key: the node takes its signature.
    client = sqs_client(endpoint, key_id, secret)
    assert client.get_queue_url(QueueName=queue)["QueueUrl"] == f"{endpoint}/{queue}"
    check("SQS: a subscriber key made, its secret shown once, and the node takes it", key_id)
    shot(page, "sqs-key")
    page.set_viewport_size(PHONE)
    expect(made).to_be_visible()
    no_overflow(page)
    shot(page, "phone-sqs")
    page.set_viewport_size(WIDE)

    # Saved: the secret leaves the page; focus goes back to the button.
    page.locator("#sqs-new-key-done").click()
    expect(made).to_have_count(0)
    expect(new_key).to_be_focused()
    assert secret not in page.content(), "the secret is still in the page"

    # Revoke: cancel first (nothing happens), then confirm.
    listed.locator("button[data-revoke]").click()
    page.locator("dialog[open] #confirm-cancel").click()
    expect(page.locator("dialog[open]")).to_have_count(0)
    expect(listed).to_have_attribute("data-state", "active")
    listed.locator("button[data-revoke]").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text(key_id)
    dialog.locator("#confirm-ok").click()
    outcome = page.locator("#sqs-outcome")
    expect(outcome).to_contain_text(f"Revoked {key_id}.")
    expect(outcome.locator("[data-applied]")).to_have_text("applied")
    expect(listed).to_have_attribute("data-state", "revoked")
    expect(listed.locator("button[data-revoke]")).to_have_count(0)
    shot(page, "sqs")
    # The API lists it revoked, without its secret; the node refuses it.
    path = f"/v1/queues/{queue}/sqs-keys"
    status, _, keys = http("GET", path, cookie=session_cookie)
    assert status == 200, (status, keys)
    assert [(k["role"], k["revoked"]) for k in keys["keys"] if k["access_key_id"] == key_id] == \
        [("subscriber", True)], keys
    assert keys["endpoint"] == endpoint and secret not in json.dumps(keys), keys
    assert sqs_refusal(lambda: client.get_queue_url(QueueName=queue)) == "InvalidClientTokenId"
    check("SQS: revoke asks first; the key is listed revoked and the node refuses it")

    # A key revoked elsewhere (the API, another tab): the page's Revoke shows the API's error.
    _, _, who = http("GET", "/console/session", cookie=session_cookie)
    status, _, other = http("POST", path, cookie=session_cookie, csrf=who["csrf"], body={"role": "publisher"})
    assert status == 201, (status, other)
    other_id = other["access_key_id"]
    page.locator("#refresh").click()
    other_row = page.locator(f'#sqs-keys tr[data-key-id="{other_id}"]')
    expect(other_row).to_have_attribute("data-state", "active")
    status, _, reply = http("DELETE", f"{path}/{other_id}", cookie=session_cookie, csrf=who["csrf"])
    assert status == 200, (status, reply)
    other_row.locator("button[data-revoke]").click()
    page.locator("dialog[open] #confirm-ok").click()
    message = f"no SQS key {other_id} on queue {queue}"
    expect(outcome).to_have_text(f"Could not revoke {other_id}: {message}")
    expect(outcome).to_have_class(re.compile(r"(^|\s)error(\s|$)"))
    expect(other_row).to_have_attribute("data-state", "revoked")
    expect(page.locator("#queue-title")).to_be_visible()  # the key's 404, not the queue's
    check("SQS: an API error is shown in the page", message)

    # A provider without an SQS face answers endpoint null; the local one always has one, so
    # the reply is stood in for here.
    page.route("**/v1/queues/*/sqs-keys", lambda route: route.fulfill(json={"endpoint": None, "keys": []}))
    page.locator("#refresh").click()
    expect(page.locator("#no-sqs-endpoint")).to_contain_text("runs no SQS face")
    expect(page.locator("#sqs-endpoint")).to_have_text("none")
    expect(page.locator("#sqs-examples pre")).to_have_count(0)
    page.unroute("**/v1/queues/*/sqs-keys")
    page.locator("#refresh").click()
    expect(page.locator("#sqs-endpoint")).to_have_text(endpoint)
    expect(page.locator("#no-sqs-endpoint")).to_have_count(0)
    check("SQS: no endpoint is said plainly")

    # A list that fails to load (the store out of reach, say) says why, in the page.
    failure = {"error": {"code": "unavailable", "message": "the store is out of reach"}}
    page.route("**/v1/queues/*/sqs-keys", lambda route: route.fulfill(status=503, json=failure))
    page.reload()
    expect(outcome).to_have_text("Could not load the SQS keys: the store is out of reach")
    expect(outcome).to_have_class(re.compile(r"(^|\s)error(\s|$)"))
    page.unroute("**/v1/queues/*/sqs-keys")
    page.reload()
    expect(page.locator("#sqs-keys tbody tr")).to_have_count(2)
    expect(outcome).to_have_text("")
    check("SQS: a list that fails to load says why")
    return other_id


def account_sqs_keys(page, queue, other_account_queue):
    """The account's SQS keys page: an admin key made there (its secret shown once) works at
    the control plane's SQS endpoint for the account's queues and no other account's; once
    revoked it is refused."""
    page.locator("#sqs-keys-link").click()
    expect(page).to_have_title(re.compile("^SQS keys"))
    endpoint = page.locator("#sqs-endpoint")
    expect(endpoint).to_have_text(BASE)
    page.locator("#new-sqs-key").click()
    page.locator("#sqs-role").select_option("admin")
    page.locator("#make-sqs-key").click()
    made = page.locator("#sqs-new-key")
    expect(made).to_contain_text("shown only now")
    expect(page.locator("#sqs-new-applied [data-applied]")).to_have_text("applied")
    key_id = page.locator("#sqs-new-key-id").inner_text()
    secret = page.locator("#sqs-new-secret").inner_text()
    assert re.fullmatch(r"QEA[A-Z0-9]{17}", key_id), key_id
    python, cli = made.locator("pre").all_inner_texts()
    compile(python, "the boto3 example", "exec")
    assert f'aws_access_key_id="{key_id}"' in python and "sqs.create_queue(" in python, python
    assert f"--endpoint-url {BASE}" in cli and secret not in python + cli, cli
    client = boto3.client("sqs", endpoint_url=BASE, region_name="local",
                          aws_access_key_id=key_id, aws_secret_access_key=secret,
                          config=botocore.config.Config(retries={"max_attempts": 0}, read_timeout=WITHIN))
    url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    assert url.endswith(f"/{queue}") and url in client.list_queues()["QueueUrls"], url
    assert sqs_refusal(lambda: client.get_queue_url(QueueName=other_account_queue)) == \
        "AWS.SimpleQueueService.NonExistentQueue"
    check("SQS keys of the account: an admin key made, shown once, and the endpoint takes it", key_id)
    shot(page, "account-sqs-key")
    page.locator("#sqs-new-key-done").click()
    listed = page.locator(f'#sqs-keys tr[data-key-id="{key_id}"]')
    expect(listed).to_have_attribute("data-state", "active")
    listed.locator("button[data-revoke]").click()
    page.locator("dialog[open] #confirm-ok").click()
    expect(page.locator("#sqs-outcome")).to_contain_text(f"Revoked {key_id}.")
    expect(listed).to_have_attribute("data-state", "revoked")
    assert secret not in page.content(), "the secret is still in the page"
    assert sqs_refusal(lambda: client.list_queues()) == "InvalidClientTokenId"
    check("SQS keys of the account: revoked, the endpoint refuses it")


def sign_in(page, token):
    box = page.locator("#token")
    expect(box).to_be_visible()
    box.fill(token)
    page.locator("#sign-in").click()


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

    expect.set_options(timeout=WITHIN * 1000)
    with sync_playwright() as playwright:
        # Scrollbars drawn as a desktop browser draws them (Playwright hides them by default),
        # so the screenshots show what scrolls.
        browser = playwright.chromium.launch(
            executable_path=SETUP["chromium"], headless=True,
            args=["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
            ignore_default_args=["--hide-scrollbars"])
        try:
            context = browser.new_context(viewport=WIDE)
            context.set_default_timeout(WITHIN * 1000)
            page = context.new_page()
            # Everything the browser logs (console calls, CSP violations, failed loads), as
            # "URL - text" like Chromium's own log, and uncaught exceptions as errors.
            logs = []
            page.on("console", lambda message: logs.append(
                {"level": message.type, "message": f"{message.location.get('url', '')} - {message.text}"}))
            page.on("pageerror", lambda error: logs.append(
                {"level": "error", "message": f"uncaught: {error}"}))
            run(page, context, logs)
        finally:
            browser.close()


def run(page, context, logs):
    alpha_key, alpha_queue, beta_queue = SETUP["alpha_key"], SETUP["alpha_queue"], SETUP["beta_queue"]

    page.goto(BASE + "/console/")
    expect(page.locator("#token")).to_be_visible()
    expect(page).to_have_title(re.compile(r"^Sign in"))
    expect(page.locator('label[for="token"]')).to_be_attached()
    shot(page, "sign-in")

    # A wrong key is refused, with a message.
    sign_in(page, "qek_AAAAAAAAAAAAAAAA_not-the-secret")
    expect(page.locator("#signin-error")).to_contain_text("not accepted")
    assert not context.cookies(), context.cookies()
    check("a wrong key is refused with a message, and no cookie is set")

    # An account's key: its own queues only.
    sign_in(page, alpha_key)
    expect(row(page, alpha_queue)).to_be_attached()
    expect(page).to_have_title(re.compile(r"^Queues"))
    expect(row(page, beta_queue)).to_have_count(0)
    assert beta_queue not in page.content()
    check("an account's key shows its queue and not another account's")

    # The token is nowhere in the page.
    stored = page.evaluate(
        "() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie,"
        " [...document.querySelectorAll('input')].map(i => i.value), document.documentElement.outerHTML])")
    secret = alpha_key.split("_", 2)[2]
    assert alpha_key not in stored and secret not in stored, "the token is in the page"
    assert "qe_session" not in page.evaluate("() => document.cookie")
    cookie = cookie_of(context, "qe_session")
    assert cookie and cookie["httpOnly"] and cookie.get("sameSite") == "Strict" and cookie["path"] == "/", cookie
    check("the token is not in storage, cookies or the DOM; the session cookie is HttpOnly, SameSite=Strict")

    # The numbers come once the node reports (every second here): Refresh until they show.
    # A report made before the setup's publishes landed shows an older depth (0) first.
    def depth_shown():
        text = cell(page, alpha_queue, "waiting")
        return text if text == str(SETUP["published"]) else None
    depth = refresh_until(page, f"the depth {SETUP['published']} from the node's report", depth_shown)
    assert cell(page, alpha_queue, "held") == "0" and cell(page, alpha_queue, "dead_letter") == "1"
    check("the depth, in-flight and DLQ numbers appear after the node reports", f"depth {depth}")

    # A publish with `qe` while the page is open: the depth changes on a refresh after the
    # node reports.
    qe_send(alpha_queue, "published while the page is open")
    published = SETUP["published"] + 1
    depth = str(published)
    refresh_until(page, "the new depth after a refresh", lambda: cell(page, alpha_queue, "waiting") == depth)
    check("a `qe send` shows in the depth on a refresh", f"depth {depth}")

    # Refresh keeps the numbers on screen (marked stale) while it loads.
    page.locator("#refresh").click()
    during = cell(page, alpha_queue, "waiting")
    assert during == depth, f"the numbers were blanked during a refresh: {during!r}"
    expect(page.locator("#queues")).not_to_have_class(re.compile(r"(^|\s)stale(\s|$)"))
    expect(page.locator("#updated")).to_contain_text("Updated")
    assert cell(page, alpha_queue, "waiting") == depth
    check("Refresh keeps the numbers visible while new ones load")
    shot(page, "queues")

    # Create a queue: its three logins, shown once.
    page.locator("#new-queue").click()
    page.locator("#new-tier").select_option("devtest")
    page.locator("#new-region").fill("local")
    page.locator("#new-instance-type").fill("local")
    for control in ["new-tier", "new-region", "new-instance-type", "new-ipv4"]:
        expect(page.locator(f'label[for="{control}"]')).to_be_attached()
    page.locator("#create").click()
    panel = page.locator("#logins")
    expect(panel).to_be_visible()
    created = panel.get_attribute("data-queue")
    expect(panel).to_contain_text("shown only now")
    passwords = page.locator("#logins .login-password").all_inner_texts()
    usernames = page.locator("#logins .login-username").all_inner_texts()
    assert len(passwords) == 3 and all(len(p) >= 16 for p in passwords), passwords
    assert len(usernames) == 3 and all(usernames), usernames
    expect(page.locator("#logins button[aria-label^='Copy']")).to_have_count(7)
    expect(row(page, created)).to_be_attached()
    # Listed at once after its create, before its node can have reported: not known, not zero.
    assert cell(page, created, "waiting") == "no report", cell(page, created, "waiting")
    shot(page, "created")
    check("a new queue shows its three logins once, with copy buttons", created)
    page.reload()
    expect(row(page, created)).to_be_attached()
    expect(page.locator("#logins")).to_have_count(0)
    source = page.content()
    assert not any(p in source for p in passwords), "a password is shown again"
    check("after a reload the logins are not shown again")

    # Delete it, with a confirmation (cancel first: nothing happens).
    page.locator(f'button[data-delete="{created}"]').click()
    page.locator("dialog[open] #confirm-cancel").click()
    expect(page.locator("dialog[open]")).to_have_count(0)
    expect(row(page, created)).to_be_attached()
    page.locator(f'button[data-delete="{created}"]').click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(created)
    dialog.locator("#confirm-ok").click()
    expect(row(page, created)).to_have_count(0, timeout=45_000)
    expect(page.locator("#updated")).to_contain_text("Updated", timeout=45_000)
    status, _, queue = http("GET", f"/v1/queues/{created}", cookie=f"qe_session={cookie['value']}")
    assert status == 200 and queue["status"] in ("deleted", "deleting"), (status, queue)
    check("delete asks first, then removes the queue", queue["status"])

    # Another account's queue, by its URL: not found.
    page.goto(f"{BASE}/console/#/queues/{beta_queue}/overview")
    expect(page.locator("#not-found")).to_be_visible()
    expect(page).to_have_title(re.compile(r"^Not found"))
    check("another account's queue is not found by its URL")

    # The queue page and its tabs.
    page.goto(f"{BASE}/console/#/queues/{alpha_queue}/overview")
    expect(page.locator('#overview [data-key="waiting"]')).to_be_visible()
    expect(page.locator('#overview [data-key="waiting"] .value')).to_have_text(depth)
    expect(page.locator("#queue-status")).to_have_text("running")
    expect(page.locator("#queue-url")).to_have_text(re.compile(r"^ws"))
    # Made through the API without a name or tags (SQS's CreateQueue gives both).
    expect(page.locator("#queue-name")).to_have_text("none (its id)")
    expect(page.locator("#queue-tags")).to_have_text("none")
    expect(page.locator("#queue-replicas")).to_have_text("1 (its node alone)")
    expect(page.locator("#report-age")).to_contain_text("reported")
    # Which build its node runs, as the node said.
    expect(page.locator("#queue-node-build")).to_contain_text("binary SHA-256 ")
    expect(page).to_have_title(re.compile("^" + re.escape(f"{alpha_queue}: Overview")))
    shot(page, "overview")

    # A queue that failed says why (the API's `failure`), on its page and in the list.
    def as_failed(route):
        queue = route.fetch().json()
        queue.update(status="failed", failure={"reason": "not running within 900 s", "since": 1})
        route.fulfill(json=queue)
    page.route(f"**/v1/queues/{alpha_queue}", as_failed)
    page.reload()
    expect(page.locator("#queue-status")).to_have_text("failed")
    expect(page.locator("#queue-failure")).to_have_text("not running within 900 s")
    page.unroute(f"**/v1/queues/{alpha_queue}")
    page.reload()
    expect(page.locator("#queue-status")).to_have_text("running")
    expect(page.locator("#queue-failure")).to_have_count(0)
    check("a failed queue's page says why it failed")
    # Keyboard: the arrow keys move between tabs.
    page.locator("#tab-overview").press("ArrowRight")
    expect(page.locator("#tab-messages")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#tab-messages")).to_be_focused()
    # Messages: through a console token and a WebSocket to the node itself.
    messages = page.locator("#messages-list tbody tr")
    expect(messages).to_have_count(published)
    page.locator("#send-test").click()
    expect(messages).to_have_count(published + 1)
    outcome = page.locator("#node-outcome")
    expect(outcome).to_have_text(re.compile(r"^Sent "))
    sent = outcome.inner_text().split()[1].rstrip(".")
    page.locator(f'#messages-list tr[data-id="{sent}"] button.show').click()
    expect(page.locator("#payload-text")).to_contain_text("A test message")
    shot(page, "messages")
    page.locator(f'#messages-list tr[data-id="{sent}"] button.delete').click()
    expect(messages).to_have_count(published)
    check("messages listed, a test message sent, shown and deleted")
    # DLQ: the dead binary message, shown in hex and base64, then redriven.
    dead = SETUP["dead"]
    page.locator("#tab-dlq").click()
    dead_row = page.locator(f'#dlq-list tr[data-id="{dead}"]')
    expect(dead_row).to_have_count(1)
    dead_row.locator("button.show").click()
    expect(page.locator("#payload-hex")).to_be_visible()
    expect(page.locator("#payload-hex")).to_have_text("00 01 02 ff")
    expect(page.locator("#payload-base64")).to_have_text("AAEC/w==")
    shot(page, "dlq")
    dead_row.locator("button.redrive-one").click()
    expect(page.locator("#dlq-list #empty")).to_be_visible()
    expect(outcome).to_have_text(re.compile("^" + re.escape(f"Redrove {dead}")))
    page.locator("#tab-messages").click()
    expect(page.locator(f'#messages-list tr[data-id="{dead}"]')).to_have_count(1)
    check("DLQ: a dead binary message shown as hex and base64, redriven back to the queue")
    # Settings: a value out of range is refused with the node's code and reason.
    page.locator("#tab-settings").click()
    field = page.locator("#setting-saved-session-timeout-secs")
    expect(field).to_be_visible()
    field.fill("5")
    page.locator("#save-saved-session-timeout-secs").click()
    expect(outcome).to_have_text(re.compile(r"^The node refused \("))
    shot(page, "settings")
    check("settings: out of range refused", outcome.inner_text())
    # The plots show the three records the test reported, plus any the node made itself when
    # the run crossed a stats interval (hourly on devtest): the expected numbers are the
    # records the API holds, read before and after the page drew them.
    before = stats_records(alpha_key, alpha_queue)
    page.locator("#tab-monitoring").click()
    charts = page.locator("#charts svg.chart")
    expect(charts).to_have_count(4)
    after = stats_records(alpha_key, alpha_queue)
    depth_plot = charts.first
    drawn = int(re.search(r": (\d+) records", depth_plot.get_attribute("aria-label")).group(1))
    records = before if drawn == len(before) else after
    assert drawn == len(records) and drawn >= 3, (drawn, len(before), len(after))
    expect(depth_plot.locator("polyline")).to_have_count(4)
    latest = records[-1]
    expect(page.locator("#charts .legend").first).to_contain_text(f"Messages (latest {latest['messages']})")
    # Published and delivered per interval: only the records that carry them (two of the
    # reported three, and any the node made).
    flowing = [r for r in records if "published" in r]
    assert len(flowing) >= 2, records
    flow_plot = charts.nth(1)
    expect(flow_plot).to_have_attribute(
        "aria-label", re.compile(f"^Published and delivered: {len(flowing)} records"))
    flow_legend = page.locator("#charts .legend").nth(1)
    expect(flow_legend).to_contain_text(f"Published (latest {flowing[-1]['published']})")
    expect(flow_legend).to_contain_text(f"Delivered (latest {flowing[-1]['delivered']})")
    page.locator("#range").select_option("7d")
    expect(charts).to_have_count(4)
    shot(page, "monitoring")
    page.locator("#tab-api").click()
    examples = page.locator("#tab-panel pre")
    expect(examples.first).to_be_visible()
    code = " ".join(examples.all_inner_texts())
    for example in [f"qe send {alpha_queue} --body '{{\"a\":1}}'",
                    f"qe receive {alpha_queue} --max-messages 10 --wait-seconds 5 --delete",
                    f"qe dlq redrive {alpha_queue}", "websocat ", "Publisher::connect", "from websockets",
                    'from "ws"', f"/v1/queues/{alpha_queue}"]:
        assert example in code, example
    shot(page, "api")
    check("the queue page: overview numbers, tabs by keyboard, monitoring plots, API examples")

    # SQS, by keyboard from the API tab.
    session_cookie = f"qe_session={cookie['value']}"
    page.locator("#tab-api").press("ArrowRight")
    expect(page.locator("#tab-sqs")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#tab-sqs")).to_be_focused()
    revoked_elsewhere = sqs_tab(page, session_cookie, alpha_queue)
    account_sqs_keys(page, alpha_queue, beta_queue)

    # CSRF: the cookie alone makes no change; with the session's token it does.
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
    page.set_viewport_size(PHONE)
    page.goto(BASE + "/console/#/")
    # The redriven message waits again beside the published ones.
    back = str(published + 1)
    # The node reports every second: the first load may show the report from before.
    refresh_until(page, "the redriven message in the depth",
                  lambda: cell(page, alpha_queue, "waiting") == back)
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1] == PHONE["width"], width
    expect(row(page, alpha_queue).locator("a")).to_be_visible()
    shot(page, "phone-queues")
    page.goto(f"{BASE}/console/#/queues/{alpha_queue}/api")
    expect(page.locator("#tab-panel pre").first).to_be_visible()
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1] == PHONE["width"], width
    shot(page, "phone-api")
    page.set_viewport_size(WIDE)
    check("at 390x844 the list and a queue page do not overflow sideways")

    # Sign out: the cookie no longer works.
    page.locator("#sign-out").click()
    expect(page.locator("#token")).to_be_visible()
    status, _, _ = http("GET", "/v1/queues", cookie=session_cookie)
    assert status == 401, status
    status, _, who = http("GET", "/console/session", cookie=session_cookie)
    assert who == {"caller": None}, who
    check("sign-out ends the session: its cookie is refused")

    # A read-only key: the console offers no change, and the API refuses one.
    sign_in(page, SETUP["reader_key"])
    expect(row(page, alpha_queue)).to_be_attached()
    expect(page.locator("#new-queue")).to_have_count(0)
    expect(page.locator("button[data-delete]")).to_have_count(0)
    page.goto(f"{BASE}/console/#/queues/{alpha_queue}/sqs")
    expect(page.locator("#sqs-keys tbody tr")).to_have_count(2)
    expect(page.locator("#new-sqs-key")).to_have_count(0)
    expect(page.locator("button[data-revoke]")).to_have_count(0)
    reader_cookie = f"qe_session={cookie_of(context, 'qe_session')['value']}"
    _, _, who = http("GET", "/console/session", cookie=reader_cookie)
    status, _, reply = http("POST", "/v1/queues", cookie=reader_cookie, csrf=who["csrf"], body=new_queue)
    assert status == 403 and "read-only" in reply["error"]["message"], (status, reply)
    check("a read-only key's session offers no change and is refused one")
    expect(page.locator("#fleet-link")).to_have_count(0)

    # The operator's builds and rollouts: a build that does not start (`true` exits at once),
    # published from a file and rolled out with the alpha queue as canary: its node refuses
    # it, the rollout halts with why, and it is rolled back.
    page.locator("#sign-out").click()
    sign_in(page, SETUP["operator_token"])
    page.locator("#fleet-link").click()
    expect(page.locator("#builds tbody tr")).to_have_count(1)
    broken = os.path.join(tempfile.mkdtemp(), "dataplane-broken")
    shutil.copy("/bin/true", broken)
    sha256 = hashlib.sha256(open(broken, "rb").read()).hexdigest()
    page.locator("#build-file").set_input_files(broken)
    page.locator("#build-label").fill("exits at once")
    page.locator("#publish").click()
    outcome = page.locator("#fleet-outcome")
    expect(outcome).to_have_text(f"Published {sha256} (x86_64).")
    expect(page.locator(f'#builds tr[data-build="{sha256}"]')).to_contain_text("exits at once")
    page.locator("#rollout-build").select_option(sha256)
    page.locator("#rollout-canary").select_option(alpha_queue)
    page.locator("#rollout-pause").fill("1")
    page.locator("#roll-out").click()
    expect(outcome).to_have_text(re.compile(r"^Rollout r\d+ started over \d+ queue"))
    rollout = page.locator("#rollouts tbody tr").first
    expect(rollout.locator("[data-state]")).to_have_attribute("data-state", "halted", timeout=60_000)
    expect(rollout.locator(".reason")).to_contain_text(f"queue {alpha_queue} refused the build")
    page.locator("#rollouts").scroll_into_view_if_needed()
    shot(page, "rollouts")
    rollout.locator('button[data-action="rollback"]').click()
    expect(rollout.locator("[data-state]")).to_have_attribute("data-state", "rolled-back")
    check("the operator publishes a build, rolls it out, sees the canary refuse it and rolls back")

    # No console errors but the refusals the test asked for.
    expected = ["/console/session - Failed to load resource: the server responded with a status of 401",
                f"/v1/queues/{beta_queue} - Failed to load resource: the server responded with a status of 404",
                f"/v1/queues/{alpha_queue}/sqs-keys/{revoked_elsewhere} - Failed to load resource: "
                "the server responded with a status of 404",
                f"/v1/queues/{alpha_queue}/sqs-keys - Failed to load resource: "
                "the server responded with a status of 503"]
    errors = [entry for entry in logs if entry["level"] == "error"
              and not any(e in entry["message"] for e in expected)]
    assert not errors, errors
    check("no console errors (CSP violations, exceptions, failed loads) but the expected refusals",
          f"{len(logs)} entries")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, PlaywrightError) as error:
        print(f"FAILED: {error}", flush=True)
        raise
    sys.exit(0)
