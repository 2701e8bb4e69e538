// The Queue Expert's web console: plain JavaScript, no framework, no build step. It calls the
// control plane's /v1 API with the session cookie (HttpOnly: this script never sees it) and
// sends the session's CSRF token, held in memory only, as X-CSRF-Token with every change.
// The token a user signs in with is sent once and never kept: not in storage, not in the page.
// Pages are hash routes: #/ (queues), #/queues/ID/TAB, #/fleet (the operator's builds and
// rollouts), #/sqs-keys (an account's SQS keys). Everything is built with DOM calls
// and textContent, so nothing the API returns is ever read as HTML.
"use strict";

const REFRESH_EVERY_MS = 30_000;
const TABS = ["overview", "messages", "dlq", "monitoring", "settings", "api", "sqs"];
const TAB_NAMES = {
  overview: "Overview", messages: "Messages", dlq: "DLQ",
  monitoring: "Monitoring", settings: "Settings", api: "API", sqs: "SQS",
};

/** Who is signed in ({kind, account?, key?, scope?}) and the session's CSRF token. */
const session = { caller: null, csrf: null };
/** The timer of the page shown, cleared when another is shown. */
let timer = null;
/** The WebSocket to the node a Messages, DLQ or Settings tab has open; closed on leaving it. */
let nodeSocket = null;

// ---- small helpers ----------------------------------------------------------------------

/** An element: h("a", {href: "#/"}, "text", child…). Strings become text nodes. */
function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "class") element.className = value;
    else element.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return element;
}

function announce(text) {
  const announcer = document.getElementById("announcer");
  announcer.textContent = "";
  setTimeout(() => { announcer.textContent = text; }, 50);
}

function setTitle(text) {
  document.title = text ? `${text} — The Queue Expert` : "The Queue Expert console";
}

function show(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
}

function formatNumber(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "—";
}

function formatBytes(n) {
  if (typeof n !== "number") return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function timeOf(date) {
  return date.toLocaleTimeString("en-GB", { hour12: false });
}

class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

/** One API call with the session cookie; a change carries the CSRF token. */
async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = session.csrf || "";
  const response = await fetch(path, {
    method, headers, credentials: "same-origin", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  if (response.status !== 204) {
    try { data = await response.json(); } catch (_) { data = null; }
  }
  if (response.status === 401 && path !== "/console/session") {
    session.caller = null;
    session.csrf = null;
    renderSignIn("Your session has ended. Sign in again.");
    throw new ApiFailure(401, "unauthorized", "signed out");
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiFailure(response.status, error.code, error.message);
  }
  return data;
}

/** A button that copies `text()` to the clipboard and says so. */
function copyButton(label, text, shown = "Copy") {
  const button = h("button", { type: "button", "aria-label": label }, shown);
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
    } catch (_) {
      button.textContent = "Select and copy by hand";
    }
    setTimeout(() => { button.textContent = shown; }, 2000);
  });
  return button;
}

/** A button (`id`, `label`) that opens the form `makeForm()` in `slot`, focused on its first
 * select, and closes it again. */
function formToggle(id, label, slot, makeForm) {
  const button = h("button", { type: "button", class: "primary", id, "aria-expanded": "false",
    "aria-controls": slot.id }, label);
  button.addEventListener("click", () => {
    const open = button.getAttribute("aria-expanded") === "true";
    button.setAttribute("aria-expanded", String(!open));
    slot.replaceChildren(...(open ? [] : [makeForm()]));
    if (!open) slot.querySelector("select").focus();
  });
  return button;
}

/** A modal question; resolves true when confirmed. */
function confirmDialog(title, text, confirmLabel) {
  return new Promise((resolve) => {
    const dialog = h("dialog", { "aria-labelledby": "confirm-title" });
    const done = (answer) => { dialog.close(); dialog.remove(); resolve(answer); };
    dialog.append(
      h("h2", { id: "confirm-title" }, title),
      h("p", {}, text),
      h("div", { class: "actions" },
        h("button", { type: "button", id: "confirm-cancel", onclick: () => done(false) }, "Cancel"),
        h("button", { type: "button", class: "danger", id: "confirm-ok", onclick: () => done(true) },
          confirmLabel)));
    dialog.addEventListener("cancel", (event) => { event.preventDefault(); done(false); });
    document.body.append(dialog);
    dialog.showModal();
    dialog.querySelector("#confirm-cancel").focus();
  });
}

function stopTimer() {
  if (timer) clearInterval(timer);
  timer = null;
  if (nodeSocket) nodeSocket.close();
  nodeSocket = null;
}

function canChange() {
  return session.caller && !(session.caller.kind === "account" && session.caller.scope === "read-only");
}

// ---- sign-in and the header --------------------------------------------------------------

function renderWho() {
  const who = document.getElementById("who");
  if (!session.caller) { who.replaceChildren(); return; }
  const caller = session.caller;
  const name = caller.kind === "operator"
    ? "Operator (every account)"
    : `Account ${caller.account}${caller.scope === "read-only" ? " (read-only key)" : ""}`;
  // (replaceChildren would show a null as the text "null".)
  const link = caller.kind === "operator"
    ? h("a", { href: "#/fleet", id: "fleet-link" }, "Builds and rollouts")
    : h("a", { href: "#/sqs-keys", id: "sqs-keys-link" }, "SQS keys");
  who.replaceChildren(link,
    h("span", { id: "signed-in-as" }, `Signed in: ${name}`),
    h("button", { type: "button", id: "sign-out", onclick: signOut }, "Sign out"));
}

function renderSignIn(message) {
  stopTimer();
  renderWho();
  setTitle("Sign in");
  const error = h("p", { id: "signin-error", class: "error", role: "alert" }, message || "");
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", spellcheck: "false",
    required: true, "aria-describedby": "token-hint",
  });
  const button = h("button", { type: "submit", class: "primary", id: "sign-in" }, "Sign in");
  const form = h("form", { class: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in to the console"),
    h("div", { class: "field" },
      h("label", { for: "token" }, "API key or operator token"),
      input,
      h("span", { id: "token-hint", class: "hint" },
        "An account's API key (qek_…) shows that account's queues; the operator's token shows every account. " +
        "It is exchanged for a session and not kept in this page.")),
    button, error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value;
    // The token leaves the page now: the field is emptied before the answer comes.
    input.value = "";
    button.disabled = true;
    error.textContent = "";
    try {
      const reply = await api("POST", "/console/session", { token });
      session.caller = reply.caller;
      session.csrf = reply.csrf;
      renderWho();
      if (!location.hash || location.hash === "#") location.hash = "#/";
      route();
    } catch (failure) {
      error.textContent = failure.status === 401
        ? "That key or token was not accepted. Check it and try again."
        : `Could not sign in: ${failure.message}`;
      button.disabled = false;
      input.focus();
    }
  });
  show(form);
  input.focus();
}

async function signOut() {
  try {
    await api("DELETE", "/console/session");
  } catch (_) { /* the session may be gone already */ }
  session.caller = null;
  session.csrf = null;
  location.hash = "#/";
  renderSignIn("You are signed out.");
}

// ---- the queues list ---------------------------------------------------------------------

/** A queue's replicas, and how its standby stands when its node reported it. */
function standbyText(queue) {
  if ((queue.replicas || 1) < 2) return "1 (its node alone)";
  const standby = queue.live && queue.live.standby;
  const epoch = queue.epoch ? `; epoch ${queue.epoch}: promoted ${queue.epoch} time(s)` : "";
  if (!standby) return `2 (node and standby; the standby not reported${epoch})`;
  const state = standby.in_sync
    ? "in sync"
    : standby.absent_ms
      ? `absent for ${Math.floor(standby.absent_ms / 1000)} s: durability 2 is answered 507 meanwhile, and the control plane replaces a standby absent for its silence limit`
      : "catching up: durability 2 is answered 507 meanwhile";
  return `2 (node and standby, ${state}, ${formatBytes(standby.lag_bytes)} behind${epoch})`;
}

/** The numbers the list shows per queue, from its `live` (null: no fresh report). */
const LIST_COLUMNS = [
  ["waiting", "Depth", "Messages waiting for a subscriber"],
  ["held", "In flight", "Delivered, not acknowledged yet"],
  ["delayed", "Delayed", "Waiting for their delay to end"],
  ["dead_letter", "DLQ", "In the dead letter queue"],
];

function renderList() {
  stopTimer();
  setTitle("Queues");
  const state = { queues: new Map(), loadedAt: null, showDeleted: false };
  const refreshButton = h("button", { type: "button", id: "refresh" }, "Refresh");
  const updated = h("span", { id: "updated", class: "stale-note", "aria-live": "polite" }, "Loading…");
  const body = h("tbody", { id: "queue-rows" });
  const table = h("table", { class: "cards", id: "queues", "aria-describedby": "updated" },
    h("caption", { class: "visually-hidden" }, "Your queues with their latest numbers"),
    h("thead", {}, h("tr", {},
      h("th", { scope: "col" }, "Queue"),
      h("th", { scope: "col" }, "Status"),
      LIST_COLUMNS.map(([, name, help]) => h("th", { scope: "col", class: "num", title: help }, name)),
      h("th", { scope: "col", class: "num" }, "Report age"),
      h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
    body);
  const empty = h("p", { id: "no-queues", class: "muted", hidden: true }, "No queues yet.");
  const showDeleted = h("input", { type: "checkbox", id: "show-deleted" });
  showDeleted.addEventListener("change", () => { state.showDeleted = showDeleted.checked; draw(); });
  const logins = h("div", { id: "logins-slot" });
  const createSlot = h("div", { id: "create-slot" });
  const newButton = canChange()
    ? formToggle("new-queue", "New queue", createSlot, () => createForm(created))
    : null;

  function cell(queue, key, label) {
    const live = queue.live;
    if (!live) {
      return h("td", { class: "num no-report", "data-label": label, "data-key": key,
        title: "The node has not reported in the last 30 s: not known, not zero" }, "no report");
    }
    return h("td", { class: "num", "data-label": label, "data-key": key }, formatNumber(live[key]));
  }

  function row(queue) {
    const link = h("a", { href: `#/queues/${encodeURIComponent(queue.id)}/overview` }, queue.id);
    const actions = h("td", { "data-label": "Actions" });
    if (canChange() && queue.status !== "deleted" && queue.status !== "deleting") {
      actions.append(h("button", {
        type: "button", class: "danger", "aria-label": `Delete queue ${queue.id}`,
        "data-delete": queue.id, onclick: () => remove(queue.id),
      }, "Delete"));
    }
    const age = queue.live ? `${Math.round(queue.live.age_secs)} s` : "—";
    return h("tr", { "data-queue": queue.id },
      h("th", { scope: "row", "data-label": "Queue" }, link),
      h("td", { "data-label": "Status" }, h("span", {
        class: `status status-${queue.status}`, title: queue.failure ? queue.failure.reason : "",
      }, queue.status)),
      LIST_COLUMNS.map(([key, name]) => cell(queue, key, name)),
      h("td", { class: "num", "data-label": "Report age" }, age),
      actions);
  }

  function draw() {
    const shown = [...state.queues.values()].filter((q) => state.showDeleted || q.status !== "deleted");
    body.replaceChildren(...shown.map(row));
    empty.hidden = shown.length > 0;
  }

  async function refresh() {
    // The numbers shown stay while new ones load, marked stale.
    table.classList.add("stale");
    table.setAttribute("aria-busy", "true");
    refreshButton.disabled = true;
    if (state.loadedAt) updated.textContent = `Refreshing… (numbers from ${timeOf(state.loadedAt)})`;
    try {
      const reply = await api("GET", "/v1/queues");
      state.queues = new Map(reply.queues.map((q) => [q.id, q]));
      state.loadedAt = new Date();
      draw();
      table.classList.remove("stale");
      updated.textContent = `Updated ${timeOf(state.loadedAt)}; refreshes every 30 s`;
    } catch (failure) {
      if (failure.status === 401) return;
      updated.textContent = state.loadedAt
        ? `Could not refresh (${failure.message}); numbers from ${timeOf(state.loadedAt)}`
        : `Could not load the queues: ${failure.message}`;
    } finally {
      table.removeAttribute("aria-busy");
      refreshButton.disabled = false;
    }
  }

  function created(queue) {
    newButton.setAttribute("aria-expanded", "false");
    createSlot.replaceChildren();
    logins.replaceChildren(loginsPanel(queue, () => logins.replaceChildren()));
    logins.querySelector("h2").focus();
    refresh();
  }

  async function remove(id) {
    const sure = await confirmDialog(`Delete queue ${id}?`,
      "Its node stops and every message in it is lost. This cannot be undone.", "Delete queue");
    if (!sure) return;
    updated.textContent = `Deleting ${id}…`;
    try {
      await api("DELETE", `/v1/queues/${encodeURIComponent(id)}`);
      announce(`Queue ${id} deleted`);
    } catch (failure) {
      if (failure.status === 401) return;
      updated.textContent = `Could not delete ${id}: ${failure.message}`;
      return;
    }
    refresh();
  }

  refreshButton.addEventListener("click", refresh);
  show(
    h("div", { class: "toolbar" },
      h("h1", {}, "Queues"),
      h("span", { class: "spacer" }),
      newButton,
      refreshButton),
    canChange() ? null : h("p", { class: "notice" }, "This key is read-only: the console shows, and changes nothing."),
    createSlot,
    logins,
    h("p", {}, updated),
    table,
    empty,
    h("div", { class: "field inline" }, showDeleted, h("label", { for: "show-deleted" }, "Show deleted queues")));
  refresh();
  timer = setInterval(refresh, REFRESH_EVERY_MS);
}

/** The form that creates a queue; `done(queue)` gets the reply with its logins. */
function createForm(done) {
  const field = (id, label, control, hint) => h("div", { class: "field" },
    h("label", { for: id }, label), control, hint ? h("span", { class: "hint", id: `${id}-hint` }, hint) : null);
  const tier = h("select", { id: "new-tier", name: "tier" },
    h("option", { value: "devtest" }, "devtest"), h("option", { value: "standard" }, "standard"));
  const label = "[a-z0-9][a-z0-9.\\-]{0,62}";
  const region = h("input", { id: "new-region", name: "region", required: true, pattern: label,
    autocomplete: "off", "aria-describedby": "new-region-hint" });
  const type = h("input", { id: "new-instance-type", name: "instance_type", required: true, pattern: label,
    autocomplete: "off", "aria-describedby": "new-instance-type-hint" });
  const ipv4 = h("input", { id: "new-ipv4", name: "ipv4", type: "checkbox" });
  const account = session.caller.kind === "operator"
    ? h("input", { id: "new-account", name: "account", autocomplete: "off", "aria-describedby": "new-account-hint" })
    : null;
  const error = h("p", { class: "error", role: "alert", id: "create-error" });
  const submit = h("button", { type: "submit", class: "primary", id: "create" }, "Create queue");
  const form = h("form", { class: "panel", id: "create-form", "aria-labelledby": "create-title" },
    h("h2", { id: "create-title" }, "New queue"),
    h("div", { class: "grid" },
      field("new-tier", "Tier", tier),
      field("new-region", "Region", region, "A region the fleet offers, e.g. local or us-east-1"),
      field("new-instance-type", "Instance type", type, "e.g. local or t4g.small"),
      account ? field("new-account", "Account (optional)", account, "The account it belongs to; empty: none") : null),
    h("div", { class: "field inline" }, ipv4, h("label", { for: "new-ipv4" }, "Public IPv4 address (IPv6 always)")),
    submit, error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    error.textContent = "";
    const asked = { tier: tier.value, region: region.value, instance_type: type.value, ipv4: ipv4.checked };
    if (account && account.value) asked.account = account.value;
    try {
      done(await api("POST", "/v1/queues", asked));
    } catch (failure) {
      if (failure.status === 401) return;
      error.textContent = `Not created: ${failure.message}`;
      submit.disabled = false;
    }
  });
  return form;
}

/** The three logins of a queue just made: shown this once, with copy buttons. */
function loginsPanel(queue, dismiss) {
  const rows = ["publisher", "subscriber", "admin"].map((role) => {
    const login = queue.logins[role] || {};
    return h("tr", { "data-role": role },
      h("th", { scope: "row", "data-label": "Role" }, role),
      h("td", { "data-label": "Username" }, h("code", { class: "login-username" }, login.username || "")),
      h("td", { "data-label": "Password" }, h("code", { class: "login-password" }, login.password || "")),
      h("td", { "data-label": "Copy" },
        copyButton(`Copy the ${role} password`, () => login.password, "Copy password"),
        " ",
        copyButton(`Copy the ${role} login as JSON`, () =>
          JSON.stringify({ username: login.username, password: login.password }), "Copy as JSON")));
  });
  return h("section", { class: "notice logins", id: "logins", "data-queue": queue.id, "aria-labelledby": "logins-title" },
    h("h2", { id: "logins-title", tabindex: "-1" }, `Queue ${queue.id} is being created: its logins, shown only now`),
    h("p", {}, h("strong", {}, "Copy them now. "),
      "Only their hashes are kept: they cannot be shown again (a lost one can be rotated). Address: ",
      h("code", {}, queue.url)),
    h("table", { class: "cards" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Role"), h("th", { scope: "col" }, "Username"),
        h("th", { scope: "col" }, "Password"), h("th", { scope: "col" }, "Copy"))),
      h("tbody", {}, rows)),
    h("div", { class: "actions" },
      copyButton("Copy all three logins as JSON", () => JSON.stringify(queue.logins, null, 2), "Copy all as JSON"),
      h("button", { type: "button", id: "logins-done", onclick: dismiss }, "I have saved them")));
}

// ---- a queue's page ----------------------------------------------------------------------

function renderQueue(id, tab) {
  stopTimer();
  if (!TABS.includes(tab)) tab = "overview";
  setTitle(`${id}: ${TAB_NAMES[tab]}`);
  const panel = h("div", { role: "tabpanel", id: "tab-panel", "aria-labelledby": `tab-${tab}`, tabindex: "0" },
    h("p", { class: "muted" }, "Loading…"));
  const tabs = TABS.map((name) => h("button", {
    type: "button", role: "tab", id: `tab-${name}`, "aria-selected": String(name === tab),
    "aria-controls": "tab-panel", tabindex: name === tab ? "0" : "-1",
    onclick: () => { location.hash = `#/queues/${encodeURIComponent(id)}/${name}`; },
  }, TAB_NAMES[name]));
  const tablist = h("div", { role: "tablist", "aria-label": "Queue pages" }, tabs);
  tablist.addEventListener("keydown", (event) => {
    const at = TABS.indexOf(tab);
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: TABS.length - 1 }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    const next = TABS[(to + TABS.length) % TABS.length];
    location.hash = `#/queues/${encodeURIComponent(id)}/${next}`;
  });
  const heading = h("h1", { id: "queue-title" }, `Queue ${id}`);
  show(h("p", {}, h("a", { href: "#/" }, "← All queues")), heading, tablist, panel);
  if (document.activeElement === document.body) document.getElementById(`tab-${tab}`).focus();

  const load = async () => api("GET", `/v1/queues/${encodeURIComponent(id)}`);
  const notFound = (failure) => {
    if (failure.status === 404) {
      setTitle("Not found");
      show(h("h1", { id: "not-found" }, "Not found"),
        h("p", {}, `There is no queue ${id} that this sign-in may see.`),
        h("p", {}, h("a", { href: "#/" }, "Back to the queues")));
      return true;
    }
    return failure.status === 401;
  };
  const view = { overview, messages: shelf, dlq: shelf, monitoring, settings, api: apiExamples, sqs: sqsKeys }[tab];
  view(id, tab, panel, load, notFound);
}

function overview(id, tab, panel, load, notFound) {
  let queue = null;
  let loadedAt = null;
  const refreshButton = h("button", { type: "button", id: "refresh" }, "Refresh");
  const updated = h("span", { class: "stale-note", id: "updated", "aria-live": "polite" });
  const body = h("div", { id: "overview" });
  const counter = (name, value, key) => h("div", { class: "counter", "data-key": key },
    h("div", { class: "value" }, value), h("div", { class: "name" }, name));
  const draw = () => {
    const live = queue.live;
    const facts = [
      ["Status", h("span", { class: `status status-${queue.status}`, id: "queue-status" }, queue.status)],
      ["Address", h("code", { id: "queue-url" }, queue.url)],
      ["Host", h("code", {}, queue.host)],
      ["Tier", queue.tier], ["Region", queue.region], ["Instance type", queue.instance_type],
      ["IPv4", queue.ipv4 ? "yes" : "no"], ["Account", queue.account || "none"],
      ["Replicas", h("span", { id: "queue-replicas" }, standbyText(queue))],
      ["Name", h("span", { id: "queue-name" }, queue.name || "none (its id)")],
      ["Tags", h("span", { id: "queue-tags" },
        Object.entries(queue.tags || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none")],
      ["Addresses", queue.addresses ? `IPv6 ${queue.addresses.v6 || "—"}, IPv4 ${queue.addresses.v4 || "—"}` : "not placed yet"],
      ["Config", `version ${queue.config.version}, node serves ${queue.config.applied}` +
        (queue.config.pending ? " (a change is pending)" : "")],
      ["Node build", queue.node_build
        ? h("span", { id: "queue-node-build" },
          `${queue.node_build.version}, binary SHA-256 ${queue.node_build.binary_sha256.slice(0, 12)}…`)
        : "not reported yet"],
    ];
    if (queue.failure) facts.splice(1, 0, ["Failure", h("span", { id: "queue-failure" }, queue.failure.reason)]);
    const parts = [h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]))];
    if (!live) {
      parts.push(h("h2", {}, "Live numbers"),
        h("p", { class: "notice", id: "no-report" },
          "No report: the node has not sent its numbers in the last 30 s (a node that is starting, stopped, " +
          "or cannot reach the control plane). They are not known, which is not zero."));
    } else {
      parts.push(
        h("h2", {}, "Messages"),
        h("div", { class: "grid" },
          counter("Waiting (depth)", formatNumber(live.waiting), "waiting"),
          counter("In flight (held)", formatNumber(live.held), "held"),
          counter("Delayed", formatNumber(live.delayed), "delayed"),
          counter("Dead letter", formatNumber(live.dead_letter), "dead_letter"),
          counter("Durable", formatNumber(live.durable), "durable")),
        h("h2", {}, "Connections"),
        h("div", { class: "grid" },
          counter("Publishers", formatNumber(live.publishers), "publishers"),
          counter("Subscribers", formatNumber(live.subscribers), "subscribers"),
          counter("Administrators", formatNumber(live.admins), "admins"),
          counter("Saved sessions", formatNumber(live.saved_sessions), "saved_sessions")),
        h("h2", {}, "Since the node started"),
        h("div", { class: "grid" },
          counter("Published", formatNumber(live.published), "published"),
          counter("Delivered", formatNumber(live.delivered), "delivered"),
          counter("Acked", formatNumber(live.acked), "acked"),
          counter("Nacked", formatNumber(live.nacked), "nacked"),
          counter("Bytes in", formatBytes(live.network_received), "network_received"),
          counter("Bytes out", formatBytes(live.network_sent), "network_sent"),
          counter("Memory used", `${formatBytes(live.messages_memory_used)} of ${formatBytes(live.max_messages_memory)}`, "memory")),
        h("p", { class: "muted", id: "report-age" }, `The node reported ${live.age_secs.toFixed(1)} s before this was loaded.` +
          (live.certificate_expires ? ` Its certificate is valid until ${new Date(live.certificate_expires * 1000).toISOString().slice(0, 10)}.` : "")));
    }
    body.replaceChildren(...parts);
  };
  const refresh = async () => {
    body.classList.add("stale");
    refreshButton.disabled = true;
    if (loadedAt) updated.textContent = `Refreshing… (numbers from ${timeOf(loadedAt)})`;
    try {
      queue = await load();
      loadedAt = new Date();
      draw();
      body.classList.remove("stale");
      updated.textContent = `Updated ${timeOf(loadedAt)}; refreshes every 30 s`;
    } catch (failure) {
      if (notFound(failure)) { stopTimer(); return; }
      updated.textContent = `Could not refresh: ${failure.message}`;
    } finally {
      refreshButton.disabled = false;
    }
  };
  refreshButton.addEventListener("click", refresh);
  panel.replaceChildren(h("div", { class: "toolbar" }, updated, h("span", { class: "spacer" }), refreshButton), body);
  refresh();
  timer = setInterval(refresh, REFRESH_EVERY_MS);
}

// ---- the node itself: Messages, DLQ, Settings ------------------------------------------------

/**
 * An admin session on the queue's node: a console token from the control plane (short-lived,
 * for this queue only, read rights for a read-only key), a WebSocket to the node, the login.
 * `request(obj)` resolves with the node's reply (replies come in order).
 */
async function openNode(id) {
  const grant = await api("POST", `/v1/queues/${encodeURIComponent(id)}/console-token`, {});
  const socket = new WebSocket(grant.url);
  nodeSocket = socket;
  const waiting = [];
  const failAll = (why) => { while (waiting.length) waiting.shift().reject(new Error(why)); };
  socket.addEventListener("message", (event) => {
    let reply;
    try { reply = JSON.parse(event.data); } catch (_) { return; }
    if (reply.cmd === "getlivestats" && waiting.length === 0) return;
    const next = waiting.shift();
    if (next) next.resolve(reply);
  });
  socket.addEventListener("close", (event) => failAll(`the node closed the connection (${event.code})`));
  await new Promise((resolve, reject) => {
    socket.addEventListener("open", resolve, { once: true });
    socket.addEventListener("error", () => reject(new Error(`cannot reach the node at ${grant.url}`)), { once: true });
  });
  const request = (value) => new Promise((resolve, reject) => {
    if (socket.readyState !== WebSocket.OPEN) { reject(new Error("the connection to the node is closed")); return; }
    waiting.push({ resolve, reject });
    socket.send(JSON.stringify(value));
  });
  const login = await request({ console_token: grant.token, role: "admin", queuetype: "distribute" });
  if (login.status !== "Success.") throw new Error(nodeFailure(login));
  return { request, rights: grant.rights, url: grant.url };
}

/** A failure reply of the node, as it gave it: its code and reason. */
function nodeFailure(reply) {
  return `The node refused (${reply.code === undefined ? "no code" : reply.code}): ${reply.reason || reply.status}`;
}

/** CSV lines (no quoting in the node's replies) as arrays of fields. */
function csvRows(text) {
  return (text || "").split("\n").filter((line) => line.length > 0).map((line) => line.split(","));
}

/** A payload for reading: JSON pretty-printed, text as is, binary (type 2) as hex and base64. */
function payloadView(msg) {
  if (!msg || msg.damaged) {
    return [h("p", { class: "notice" }, "A damaged record: its file is kept as it was found (base64)."),
      h("pre", { class: "payload", id: "payload-base64" }, (msg && msg.file) || "(too big to show)")];
  }
  if (msg.type === 2) {
    let hex = "";
    try {
      const bytes = atob(msg.body);
      for (let i = 0; i < bytes.length; i++) {
        hex += bytes.charCodeAt(i).toString(16).padStart(2, "0") + (i % 16 === 15 ? "\n" : " ");
      }
    } catch (_) { hex = "(not valid base64)"; }
    return [h("h4", {}, "Binary: hex"), h("pre", { class: "payload", id: "payload-hex" }, hex.trimEnd()),
      h("h4", {}, "Base64"), h("pre", { class: "payload", id: "payload-base64" }, msg.body)];
  }
  const body = typeof msg.body === "string" ? msg.body : JSON.stringify(msg.body);
  try {
    const pretty = JSON.stringify(JSON.parse(body), null, 2);
    return [h("h4", {}, "JSON"), h("pre", { class: "payload", id: "payload-json" }, pretty)];
  } catch (_) {
    return [h("h4", {}, "Text"), h("pre", { class: "payload", id: "payload-text" }, body)];
  }
}

/** A button that asks once more before it acts. */
function confirmButton(label, confirmLabel, attrs, act) {
  const button = h("button", { type: "button", ...attrs }, label);
  let armed = false;
  button.addEventListener("click", () => {
    if (!armed) { armed = true; button.textContent = confirmLabel; button.classList.add("danger"); return; }
    armed = false; button.textContent = label; button.classList.remove("danger");
    act();
  });
  button.addEventListener("blur", () => { armed = false; button.textContent = label; button.classList.remove("danger"); });
  return button;
}

const PAGE = 20;

/** Messages and DLQ: one page of messages, each shown, deleted; a test message; purge; redrive. */
function shelf(id, tab, panel, load, notFound) {
  const dlq = tab === "dlq";
  const cmds = dlq ? { list: "getdlqmsgs", show: "getdlqmsg", del: "deldlqmsg", scope: "dlq" }
    : { list: "getmsgs", show: "getmsg", del: "delmsg", scope: "waiting" };
  const status = h("p", { id: "node-status", role: "status", "aria-live": "polite" }, "Connecting to the node…");
  const outcome = h("p", { id: "node-outcome", "aria-live": "polite" });
  const table = h("div", { id: `${tab}-list` });
  const detail = h("div", { id: "message-detail" });
  const toolbar = h("div", { class: "toolbar" });
  panel.replaceChildren(status, toolbar, outcome, table, detail);
  let node = null;
  let after = "";
  const pages = [];
  const say = (text) => { outcome.textContent = text; announce(text); };
  const run = async (value, done) => {
    try {
      const reply = await node.request(value);
      if (reply.status !== "Success.") { say(nodeFailure(reply)); return null; }
      if (done) say(done(reply));
      return reply;
    } catch (error) { say(error.message); return null; }
  };
  const list = async () => {
    const reply = await run({ cmd: cmds.list, after, count: PAGE });
    if (!reply) return;
    const rows = csvRows(reply.csv);
    const head = ["Id", "Bytes", "Delay", "Durability", "Type", "Received", ""];
    const body = rows.map(([mid, len, delay, durability, type, received]) => h("tr", { "data-id": mid },
      h("td", {}, h("code", {}, mid)), h("td", {}, len), h("td", {}, delay), h("td", {}, durability),
      h("td", {}, type === "2" ? "binary" : "text"),
      h("td", {}, new Date(Number(received) * 1000).toISOString().replace(".000Z", "Z")),
      h("td", { class: "actions" },
        h("button", { type: "button", class: "show", "aria-label": `Show message ${mid}`, onclick: () => showOne(mid) }, "Show"),
        write ? h("button", { type: "button", class: "delete", "aria-label": `Delete message ${mid}`,
          onclick: () => run({ cmd: cmds.del, id: mid }, () => `Deleted ${mid}.`).then((r) => r && list()) }, "Delete") : null,
        write && dlq ? h("button", { type: "button", class: "redrive-one", "aria-label": `Redrive message ${mid}`,
          onclick: () => run({ cmd: "redrive", ids: [mid] }, () => `Redrove ${mid}: it is back in the queue.`).then((r) => r && list()) }, "Redrive") : null)));
    const more = rows.length === PAGE;
    table.replaceChildren(
      rows.length === 0 ? h("p", { id: "empty" }, dlq ? "The dead letter queue is empty." : "No messages.") :
        h("table", { class: "messages" }, h("thead", {}, h("tr", {}, head.map((name) => h("th", { scope: "col" }, name)))), h("tbody", {}, body)),
      h("div", { class: "toolbar" },
        h("button", { type: "button", id: "first-page", disabled: pages.length === 0, onclick: () => { after = ""; pages.length = 0; list(); } }, "First page"),
        h("button", { type: "button", id: "next-page", disabled: !more, onclick: () => { pages.push(after); after = rows[rows.length - 1][0]; list(); } }, "Next page")));
  };
  const showOne = async (mid) => {
    const reply = await run({ cmd: cmds.show, id: mid });
    if (!reply) return;
    detail.replaceChildren(h("h3", { id: "detail-title" }, `Message ${mid}`),
      h("p", {}, `${reply.len} bytes, delay ${reply.delay}, durability ${reply.durability}`),
      ...payloadView(reply.msg));
  };
  let write = false;
  (async () => {
    try {
      node = await openNode(id);
    } catch (error) {
      if (error instanceof ApiFailure && notFound(error)) return;
      status.textContent = `Cannot open the node: ${error.message}`;
      return;
    }
    write = node.rights === "write";
    status.textContent = `Connected to ${node.url} as its administrator` + (write ? "." : " (read only: this key cannot change anything).");
    const refresh = h("button", { type: "button", id: "refresh" }, "Refresh");
    refresh.addEventListener("click", list);
    const parts = [refresh, h("span", { class: "spacer" })];
    if (write && !dlq) {
      const input = h("input", { id: "test-body", type: "text", value: "A test message from the console" });
      parts.push(h("label", { for: "test-body" }, "Test message"), input,
        h("button", { type: "button", id: "send-test", onclick: () =>
          run({ cmd: "addmsg", body: input.value }, (r) => `Sent ${r.id}.`).then((r) => r && list()) }, "Send"));
    }
    if (write && dlq) {
      parts.push(h("button", { type: "button", id: "redrive-all", onclick: () =>
        run({ cmd: "redrive" }, (r) => `Redrove ${r.redriven}: back in the queue.`).then((r) => r && list()) }, "Redrive all"));
    }
    if (write) {
      parts.push(confirmButton(dlq ? "Purge the DLQ" : "Purge waiting", "Confirm purge", { id: "purge" },
        () => run({ cmd: "purge", scope: cmds.scope }, (r) => `Purged ${r.purged}.`).then((r) => r && list())));
    }
    toolbar.replaceChildren(...parts);
    list();
  })();
}

/** Settings: the node's getcfg, each writable one with its range; setcfg shows the node's reply. */
function settings(id, tab, panel, load, notFound) {
  const status = h("p", { id: "node-status", role: "status", "aria-live": "polite" }, "Connecting to the node…");
  const outcome = h("p", { id: "node-outcome", "aria-live": "polite" });
  const body = h("div", { id: "settings" });
  panel.replaceChildren(status, outcome, body);
  const say = (text) => { outcome.textContent = text; announce(text); };
  (async () => {
    let node;
    try {
      node = await openNode(id);
    } catch (error) {
      if (error instanceof ApiFailure && notFound(error)) return;
      status.textContent = `Cannot open the node: ${error.message}`;
      return;
    }
    const write = node.rights === "write";
    status.textContent = `Connected to ${node.url}` + (write ? "." : " (read only).");
    const draw = async () => {
      const reply = await node.request({ cmd: "getcfg" });
      if (reply.status !== "Success.") { say(nodeFailure(reply)); return; }
      const rows = csvRows(reply.csv).map(([name, mode, value]) => {
        const range = SETTING_RANGES[name];
        let cell = h("code", {}, value);
        if (mode === "w" && write) {
          const input = h("input", { id: `setting-${name}`, type: "number", value, "aria-describedby": `range-${name}` });
          const save = h("button", { type: "button", id: `save-${name}`, "aria-label": `Save ${name}` }, "Save");
          save.addEventListener("click", async () => {
            let reply;
            try {
              reply = await node.request({ cmd: "setcfg", [name]: Number(input.value) });
            } catch (error) { say(error.message); return; }
            if (reply.status === "Success.") { say(`Saved ${name} = ${input.value}.`); draw(); } else say(nodeFailure(reply));
          });
          cell = h("span", {}, h("label", { class: "visually-hidden", for: `setting-${name}` }, name), input, " ", save);
        }
        return h("tr", { "data-setting": name },
          h("th", { scope: "row" }, h("code", {}, name)), h("td", {}, mode === "w" ? "changeable" : "read only"),
          h("td", {}, cell), h("td", { id: `range-${name}` }, range || ""));
      });
      body.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["Setting", "", "Value", "Range"].map((n) => h("th", { scope: "col" }, n)))),
        h("tbody", {}, rows)));
    };
    draw().catch((error) => say(error.message));
  })();
}

/** The manual's ranges of the writable settings (the node checks them; this only says them). */
const SETTING_RANGES = {
  "max-ws-msg-len": "1024 to 1048576", "max-subscriber-capacity": "1 to 1024",
  "saved-session-timeout-secs": "10 to 86400", "no-reply-timeout-secs": "1 to 300",
  "stats-frequency-secs": "300 to 3600", "stats-retention-period-yrs": "1 to 10",
  "usage-frequency-secs": "1800 to 86400", "usage-retention-period-yrs": "1 to 20",
  "max-receive-count": "0 (unlimited) to 1000", "message-retention-secs": "0 (until handled) to 1209600",
  "visibility-timeout-secs": "0 to 43200",
};

// ---- monitoring --------------------------------------------------------------------------

const RANGES = [["1h", "Last hour", 3600], ["24h", "Last 24 hours", 86400], ["7d", "Last 7 days", 7 * 86400],
  ["30d", "Last 30 days", 30 * 86400]];

function dateOf(secs) {
  return new Date(secs * 1000).toISOString().slice(0, 10);
}

function monitoring(id, tab, panel, load, notFound) {
  const select = h("select", { id: "range" },
    RANGES.map(([value, name]) => h("option", { value, selected: value === "24h" }, name)));
  const charts = h("div", { id: "charts", "aria-live": "polite" });
  const draw = async () => {
    const seconds = RANGES.find(([value]) => value === select.value)[2];
    const to = Math.floor(Date.now() / 1000);
    const from = to - seconds;
    const query = `from=${dateOf(from)}&to=${dateOf(to)}&queue=${encodeURIComponent(id)}`;
    charts.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    try {
      const [stats, usage] = await Promise.all([api("GET", `/v1/stats?${query}`), api("GET", `/v1/usage?${query}`)]);
      const inRange = (r) => r.time >= from && r.time <= to;
      const records = stats.stats.filter(inRange).sort((a, b) => a.time - b.time);
      const periods = usage.usage.filter(inRange).sort((a, b) => a.time - b.time);
      charts.replaceChildren(
        h("h2", {}, "Depth"),
        chart("Depth", records, [["messages", "Messages"], ["unacknowledged", "In flight"],
          ["delayed", "Delayed"], ["dead_letter", "Dead letter"]], formatNumber),
        h("h2", {}, "Published and delivered per interval"),
        chart("Published and delivered", records.filter((r) => r.published !== undefined),
          [["published", "Published"], ["delivered", "Delivered"]], formatNumber),
        h("h2", {}, "Connections"),
        chart("Connections", records, [["publishers", "Publishers"], ["subscribers", "Subscribers"],
          ["administrators", "Administrators"], ["saved_subscribers", "Saved sessions"]], formatNumber),
        h("h2", {}, "Bytes in and out per usage period"),
        chart("Bytes", periods, [["network_received", "Bytes in"], ["network_sent", "Bytes out"]], formatBytes),
        h("p", { class: "muted" },
          "Depth, connections, and the messages published and delivered in each interval come from the " +
          "node's stats records (one per stats interval: the stats-frequency-secs setting); bytes from its " +
          "usage records (one per usage period). A delivery counts each time a message is handed to a " +
          "subscriber, so a returned message delivered again counts twice."));
    } catch (failure) {
      if (notFound(failure)) return;
      charts.replaceChildren(h("p", { class: "error" }, `Could not load the history: ${failure.message}`));
    }
  };
  select.addEventListener("change", draw);
  panel.replaceChildren(h("div", { class: "field inline" }, h("label", { for: "range" }, "Range"), select), charts);
  draw();
}

/** A line chart of `series` ([key, name]) over `records` (each with `time`), as inline SVG. */
function chart(title, records, series, format) {
  if (records.length === 0) {
    return h("p", { class: "muted no-data" }, `${title}: no records in this range yet.`);
  }
  const ns = "http://www.w3.org/2000/svg";
  const svgElement = (tag, attrs, text) => {
    const element = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) element.setAttribute(k, v);
    if (text !== undefined) element.textContent = text;
    return element;
  };
  const [width, height, left, right, top, bottom] = [800, 220, 70, 10, 10, 30];
  const t0 = records[0].time;
  const t1 = Math.max(records[records.length - 1].time, t0 + 1);
  const max = Math.max(1, ...records.flatMap((r) => series.map(([key]) => r[key] || 0)));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  const svg = svgElement("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `${title}: ${records.length} records from ${new Date(t0 * 1000).toISOString()} to ` +
      `${new Date(t1 * 1000).toISOString()}, highest ${format(max)}` });
  svg.append(svgElement("title", {}, title));
  svg.append(svgElement("line", { x1: left, x2: width - right, y1: y(0), y2: y(0), stroke: "#d0d7de" }));
  svg.append(svgElement("line", { x1: left, x2: width - right, y1: y(max), y2: y(max), stroke: "#eaeef2" }));
  svg.append(svgElement("text", { x: left - 6, y: y(max) + 4, "text-anchor": "end" }, format(max)));
  svg.append(svgElement("text", { x: left - 6, y: y(0) + 4, "text-anchor": "end" }, "0"));
  svg.append(svgElement("text", { x: left, y: height - 8 }, new Date(t0 * 1000).toLocaleString("en-GB")));
  svg.append(svgElement("text", { x: width - right, y: height - 8, "text-anchor": "end" },
    new Date(t1 * 1000).toLocaleString("en-GB")));
  series.forEach(([key], i) => {
    const points = records.map((r) => `${x(r.time).toFixed(1)},${y(r[key] || 0).toFixed(1)}`).join(" ");
    svg.append(svgElement("polyline", { points, class: `s${i}` }));
  });
  const legend = h("ul", { class: "legend" }, series.map(([key, name], i) => {
    const last = records[records.length - 1][key];
    return h("li", {}, h("span", { class: `swatch s${i}`, "aria-hidden": "true" }), `${name} (latest ${format(last)})`);
  }));
  return h("figure", { class: "plot" }, svg, legend);
}

// ---- API examples ------------------------------------------------------------------------

function apiExamples(id, tab, panel, load, notFound) {
  panel.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  load().then((queue) => {
    const origin = location.origin;
    const url = queue.url;
    const login = (role) => `{"username":"${role.toUpperCase()}-NAME","password":"${role.toUpperCase()}-PASSWORD",` +
      `"role":"${role}","queuetype":"distribute"}`;
    const examples = [
      ["The control plane (curl)", [
        `export QE_TOKEN=YOUR-API-KEY`,
        `curl -H "Authorization: Bearer $QE_TOKEN" ${origin}/v1/queues/${id}`,
        `curl -H "Authorization: Bearer $QE_TOKEN" "${origin}/v1/stats?from=${dateOf(Date.now() / 1000 - 86400)}&to=${dateOf(Date.now() / 1000)}&queue=${id}"`,
        `curl -X POST -H "Authorization: Bearer $QE_TOKEN" ${origin}/v1/queues/${id}/logins/publisher/rotate`,
        `curl -X DELETE -H "Authorization: Bearer $QE_TOKEN" ${origin}/v1/queues/${id}`,
      ].join("\n")],
      ["websocat (type each line after it connects)", [
        `websocat ${url}`,
        login("publisher"),
        `{"body":"Hello from websocat"}`,
      ].join("\n")],
      ["Python (websockets)", [
        "import asyncio, json",
        "from websockets.asyncio.client import connect",
        "",
        "async def main():",
        `    async with connect("${url}") as socket:`,
        `        await socket.send(json.dumps(${login("publisher")}))`,
        "        print(json.loads(await socket.recv()))",
        `        await socket.send(json.dumps({"body": "Hello from Python"}))`,
        "        print(json.loads(await socket.recv()))",
        "",
        "asyncio.run(main())",
      ].join("\n")],
      ["Node.js (ws)", [
        `import WebSocket from "ws";`,
        "",
        `const socket = new WebSocket("${url}");`,
        `socket.on("open", () => socket.send(JSON.stringify(${login("publisher")})));`,
        "let loggedIn = false;",
        `socket.on("message", (data) => {`,
        "  console.log(JSON.parse(data));",
        `  if (!loggedIn) { loggedIn = true; socket.send(JSON.stringify({ body: "Hello from Node" })); }`,
        "  else socket.close();",
        "});",
      ].join("\n")],
      ["Rust (qe-client)", [
        "use qe_client::{Credentials, Endpoint, Message, Publisher};",
        "",
        "#[tokio::main]",
        "async fn main() -> qe_client::Result<()> {",
        `    let endpoint = Endpoint::new("${url}")?;`,
        `    let login = Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD");`,
        "    let publisher = Publisher::connect(&endpoint, login).await?;",
        `    let id = publisher.publish(Message::text("Hello from Rust")).await?;`,
        `    println!("published {id}");`,
        "    Ok(())",
        "}",
      ].join("\n")],
      ["The qe command", [
        `qe send ${id} --body '{"a":1}'`,
        `qe receive ${id} --max-messages 10 --wait-seconds 5 --delete`,
        `qe purge ${id}`,
        `qe dlq redrive ${id}`,
        `qe queues get ${id}`,
      ].join("\n")],
    ];
    panel.replaceChildren(
      h("p", {}, "PUBLISHER-NAME and PUBLISHER-PASSWORD stand for the publisher login shown when the queue " +
        "was made (subscriber and admin logins work the same way with their roles)."),
      ...examples.map(([title, code], i) => codeExample(`example-${i}`, "h2", title, code)));
  }).catch((failure) => {
    if (!notFound(failure)) panel.replaceChildren(h("p", { class: "error" }, failure.message));
  });
}

/** One example: its title (a `heading` element with id `id`), a copy button, the code. */
function codeExample(id, heading, title, code) {
  return h("section", { class: "example", "aria-labelledby": id },
    h("div", { class: "example-head" }, h(heading, { id }, title),
      copyButton(`Copy the ${title} example`, () => code)),
    h("pre", {}, h("code", {}, code)));
}

// ---- SQS keys ----------------------------------------------------------------------------

/** The roles an SQS key may have, with what each may call (docs/sqs.md). */
const SQS_ROLES = [
  ["publisher", "publisher: sends"],
  ["subscriber", "subscriber: receives, deletes, changes visibility"],
  ["admin", "admin: everything, purge and queue attributes too"],
];

/** The calls the examples make for a key of each role: [boto3 lines, `aws sqs` line]. */
const SQS_CALLS = {
  publisher: [[`sqs.send_message(QueueUrl=url, MessageBody="Hello from boto3")`],
    (url) => `aws sqs send-message --queue-url ${url} --message-body "Hello from the AWS CLI"`],
  subscriber: [[`for message in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5).get("Messages", []):`,
    `    print(message["Body"])`,
    `    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])`],
    (url) => `aws sqs receive-message --queue-url ${url} --wait-time-seconds 5`],
  admin: [[`print(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])`],
    (url) => `aws sqs get-queue-attributes --queue-url ${url} --attribute-names All`],
};

/** Any region is taken (the node checks the one the client signed for); the SDKs need one. */
const SQS_REGION = "us-east-1";

function utcTime(secs) {
  return new Date(secs * 1000).toISOString().replace(".000Z", "Z");
}

/** A key change's `applied`: whether the node served it within the control plane's wait. */
function appliedState(applied, servedText) {
  const state = applied ? "applied" : "pending";
  return [h("span", { class: `status status-${state}`, "data-applied": String(applied) }, state), " ",
    applied ? servedText : "the node has not confirmed yet"];
}

/**
 * boto3 and `aws sqs` for the key `keyId` of `role` (null: a publisher's and a subscriber's
 * calls). The secret stays a placeholder, as the API tab's passwords do: an example gets
 * pasted and shared more freely than a secret should be.
 */
function sqsExamples(prefix, endpoint, queueUrl, keyId, role) {
  const calls = role ? [SQS_CALLS[role]] : [SQS_CALLS.publisher, SQS_CALLS.subscriber];
  const python = [
    "import boto3",
    "",
    `sqs = boto3.client("sqs", endpoint_url="${endpoint}", region_name="${SQS_REGION}",`,
    `                   aws_access_key_id="${keyId}", aws_secret_access_key="SECRET-ACCESS-KEY")`,
    `url = "${queueUrl}"`,
    ...calls.flatMap(([lines]) => lines),
  ].join("\n");
  const cli = [
    `export AWS_ACCESS_KEY_ID=${keyId} AWS_SECRET_ACCESS_KEY=SECRET-ACCESS-KEY AWS_DEFAULT_REGION=${SQS_REGION}`,
    ...calls.map(([, line]) => `${line(queueUrl)} --endpoint-url ${endpoint}`),
  ].join("\n");
  return [codeExample(`${prefix}-python`, "h3", "Python (boto3)", python),
    codeExample(`${prefix}-cli`, "h3", "The AWS CLI (aws sqs)", cli)];
}

/** A key just made: its id and secret shown this once, with copy buttons and examples. */
function newSqsKeyPanel(made, examples, dismiss) {
  const exports = `export AWS_ACCESS_KEY_ID=${made.access_key_id} AWS_SECRET_ACCESS_KEY=${made.secret}`;
  return h("section", { class: "notice logins", id: "sqs-new-key", "data-key-id": made.access_key_id,
    "aria-labelledby": "sqs-new-key-title" },
    h("h2", { id: "sqs-new-key-title", tabindex: "-1" }, `New ${made.role} key: its secret, shown only now`),
    h("p", {}, h("strong", {}, "Copy it now. "),
      "The secret is not kept: it cannot be shown again (for a lost one, make a new key and revoke this one)."),
    h("table", { class: "cards stack" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Role"), h("th", { scope: "col" }, "Access key id"),
        h("th", { scope: "col" }, "Secret"), h("th", { scope: "col" }, "Copy"))),
      h("tbody", {}, h("tr", { "data-role": made.role },
        h("th", { scope: "row", "data-label": "Role" }, made.role),
        h("td", { "data-label": "Access key id" }, h("code", { id: "sqs-new-key-id" }, made.access_key_id)),
        h("td", { "data-label": "Secret" }, h("code", { id: "sqs-new-secret" }, made.secret)),
        h("td", { "data-label": "Copy" },
          copyButton("Copy the access key id", () => made.access_key_id, "Copy id"),
          " ",
          copyButton("Copy the secret", () => made.secret, "Copy secret"),
          " ",
          copyButton("Copy both as shell exports", () => exports, "Copy as exports"))))),
    h("p", { id: "sqs-new-applied" }, made.queue_url === undefined ? "On the account's nodes: " : "On the node: ",
      appliedState(made.applied, "the node serves it")),
    examples(made),
    h("div", { class: "actions" },
      h("button", { type: "button", id: "sqs-new-key-done", onclick: dismiss }, "I have saved it")));
}

/** The form that makes a key at `path`; `done(reply)` gets the reply with its secret. */
function sqsKeyForm(path, reads, done) {
  const role = h("select", { id: "sqs-role", name: "role", "aria-describedby": "sqs-role-hint" },
    SQS_ROLES.map(([value]) => h("option", { value }, value)));
  const error = h("p", { class: "error", role: "alert", id: "sqs-error" });
  const submit = h("button", { type: "submit", class: "primary", id: "make-sqs-key" }, "Make key");
  const form = h("form", { class: "panel", id: "sqs-key-form", "aria-labelledby": "sqs-key-form-title" },
    h("h2", { id: "sqs-key-form-title" }, "New SQS key"),
    h("div", { class: "field" },
      h("label", { for: "sqs-role" }, "Role"),
      h("div", { class: "field inline" }, role, submit),
      h("span", { class: "hint", id: "sqs-role-hint" }, SQS_ROLES.map(([, what]) => what).join("; ") +
        `. ${reads}`)),
    error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    error.textContent = "";
    try {
      done(await api("POST", path, { role: role.value }));
    } catch (failure) {
      if (failure.status === 401) return;
      error.textContent = `Not made: ${failure.message}`;
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

/** SQS: the queue's SQS endpoint and keys; make a key (its secret shown once), revoke one. */
function sqsKeys(id, tab, panel, load, notFound) {
  const owner = {
    path: `/v1/queues/${encodeURIComponent(id)}/sqs-keys`,
    intro: "Code written against Amazon SQS (boto3, the AWS SDKs, the AWS CLI) reaches this queue at its " +
      "SQS endpoint, signing with a key made here. A key's role decides what it may call.",
    reads: "Every role may read the queue's URL and attributes.",
    caption: "The queue's SQS keys",
    load,
    notFound,
    facts: queueSqsFacts,
    examples: (queue, endpoint) => endpoint ? [h("h2", {}, "Examples"),
      h("p", {}, "ACCESS-KEY-ID and SECRET-ACCESS-KEY stand for a key made here, shown when it was made; " +
        "each call needs a key of a role that may make it."),
      ...sqsExamples("sqs-example", endpoint, `${endpoint}/${queue.id}`, "ACCESS-KEY-ID", null)] : [],
    madeExamples: (made) => made.endpoint
      ? [h("p", {}, "SECRET-ACCESS-KEY stands for the secret above."),
        ...sqsExamples("sqs-new", made.endpoint, made.queue_url, made.access_key_id, made.role)]
      : h("p", { class: "muted" }, "No examples: this queue has no SQS endpoint."),
  };
  sqsKeyPage(owner, panel);
}

/** The facts of a queue's SQS face: its endpoint, its URL, its config version. */
function queueSqsFacts(queue, endpoint) {
  const config = `version ${queue.config.version}, node serves ${queue.config.applied}` +
    (queue.config.pending ? " (a change is pending: a key made or revoked since may not apply yet)" : "");
  const rows = endpoint
    ? [["Endpoint", h("code", { id: "sqs-endpoint" }, endpoint)],
      ["Queue URL", h("code", { id: "sqs-queue-url" }, `${endpoint}/${queue.id}`)]]
    : [["Endpoint", h("span", { id: "sqs-endpoint" }, "none")]];
  rows.push(["Config", h("span", { id: "sqs-config" }, config)]);
  const list = h("dl", { class: "facts" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  return [list, ...(endpoint ? [] : [h("p", { class: "notice", id: "no-sqs-endpoint" },
    "No SQS endpoint: this queue's provider runs no SQS face (or its node has no address yet). " +
    "Keys can be made, but no SQS client can reach the queue until it has one.")])];
}

/**
 * SQS keys of an owner (a queue, or an account): the list, a form that makes one (its secret
 * shown once), revoke buttons. `owner` gives the API path, the texts, what to load with the
 * keys, and the facts and examples drawn from both.
 */
function sqsKeyPage(owner, panel) {
  const path = owner.path;
  let loadedAt = null;
  const refreshButton = h("button", { type: "button", id: "refresh" }, "Refresh");
  const updated = h("span", { class: "stale-note", id: "updated", "aria-live": "polite" });
  const facts = h("div", { id: "sqs-facts" });
  const keySlot = h("div", { id: "sqs-key-slot" });
  const outcome = h("p", { id: "sqs-outcome", tabindex: "-1", "aria-live": "polite" });
  const body = h("tbody", { id: "sqs-key-rows" });
  const table = h("table", { class: "cards sqs-keys", id: "sqs-keys", "aria-describedby": "updated" },
    h("caption", { class: "visually-hidden" }, owner.caption),
    h("thead", {}, h("tr", {},
      h("th", { scope: "col" }, "Access key id"), h("th", { scope: "col" }, "Role"),
      h("th", { scope: "col" }, "Created (UTC)"), h("th", { scope: "col" }, "State"),
      h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
    body);
  const empty = h("p", { id: "no-sqs-keys", class: "muted", hidden: true }, "No SQS keys yet.");
  const examples = h("div", { id: "sqs-examples" });
  const newButton = canChange()
    ? formToggle("new-sqs-key", "New key", keySlot, () => sqsKeyForm(path, owner.reads, made))
    : null;
  const say = (parts, failed) => {
    outcome.replaceChildren(...[parts].flat(Infinity));
    outcome.classList.toggle("error", Boolean(failed));
    announce(outcome.textContent);
  };

  function row(key) {
    const state = key.revoked ? "revoked" : "active";
    const actions = h("td", { "data-label": "Actions" });
    if (canChange() && !key.revoked) {
      actions.append(h("button", {
        type: "button", class: "danger", "aria-label": `Revoke SQS key ${key.access_key_id}`,
        "data-revoke": key.access_key_id, onclick: () => revoke(key.access_key_id),
      }, "Revoke"));
    }
    return h("tr", { "data-key-id": key.access_key_id, "data-state": state },
      h("th", { scope: "row", "data-label": "Access key id" }, h("code", {}, key.access_key_id)),
      h("td", { "data-label": "Role" }, key.role),
      h("td", { "data-label": "Created (UTC)" }, utcTime(key.created)),
      h("td", { "data-label": "State" }, h("span", { class: `status status-${state}` }, state)),
      actions);
  }

  async function refresh() {
    // The keys shown stay while new ones load, marked stale.
    table.classList.add("stale");
    table.setAttribute("aria-busy", "true");
    refreshButton.disabled = true;
    if (loadedAt) updated.textContent = `Refreshing… (keys from ${timeOf(loadedAt)})`;
    try {
      const [owned, listed] = await Promise.all([owner.load(), api("GET", path)]);
      loadedAt = new Date();
      facts.replaceChildren(...owner.facts(owned, listed.endpoint));
      body.replaceChildren(...listed.keys.map(row));
      empty.hidden = listed.keys.length > 0;
      examples.replaceChildren(...owner.examples(owned, listed.endpoint));
      table.classList.remove("stale");
      updated.textContent = `Updated ${timeOf(loadedAt)}; refreshes every 30 s`;
    } catch (failure) {
      if (owner.notFound(failure)) { stopTimer(); return; }
      if (loadedAt) {
        updated.textContent = `Could not refresh (${failure.message}); keys from ${timeOf(loadedAt)}`;
      } else {
        updated.textContent = "Not loaded";
        say(`Could not load the SQS keys: ${failure.message}`, true);
      }
    } finally {
      table.removeAttribute("aria-busy");
      refreshButton.disabled = false;
    }
  }

  // The new key's panel takes the form's place; no other key is made until it is dismissed,
  // so that none replaces a secret not saved yet.
  function made(reply) {
    newButton.setAttribute("aria-expanded", "false");
    newButton.disabled = true;
    keySlot.replaceChildren(newSqsKeyPanel(reply, owner.madeExamples, () => {
      keySlot.replaceChildren();
      newButton.disabled = false;
      newButton.focus();
    }));
    keySlot.querySelector("h2").focus();
    keySlot.scrollIntoView({ block: "start" });
    refresh();
  }

  async function revoke(keyId) {
    const sure = await confirmDialog(`Revoke SQS key ${keyId}?`,
      "Clients signing with it are refused once the node serves the change. This cannot be undone " +
      "(a new key can be made).", "Revoke key");
    if (!sure) return;
    say(`Revoking ${keyId}…`);
    try {
      // A 404 here is the key (revoked already, say in another tab), not the queue.
      const reply = await api("DELETE", `${path}/${encodeURIComponent(keyId)}`);
      say([`Revoked ${reply.revoked}. On the node: `, appliedState(reply.applied, "the node refuses it now")]);
    } catch (failure) {
      if (failure.status === 401) return;
      say(`Could not revoke ${keyId}: ${failure.message}`, true);
    }
    outcome.focus();
    refresh();
  }

  refreshButton.addEventListener("click", refresh);
  // Without the controls a read-only key does not get (null).
  panel.replaceChildren(...[
    h("div", { class: "toolbar" }, updated, h("span", { class: "spacer" }), newButton, refreshButton),
    h("p", {}, owner.intro),
    facts,
    canChange() ? null : h("p", { class: "notice" }, "This key is read-only: the console shows, and changes nothing."),
    keySlot,
    h("h2", {}, "Keys"),
    outcome,
    table,
    empty,
    examples,
  ].filter((part) => part !== null));
  refresh();
  timer = setInterval(refresh, REFRESH_EVERY_MS);
}

// ---- the account's SQS keys (docs/sqs.md, *The account's endpoint*) ------------------------

/** boto3 and `aws sqs` with an account's key at the control plane's endpoint. */
function accountSqsExamples(prefix, endpoint, keyId) {
  const python = [
    "import boto3",
    "",
    `sqs = boto3.client("sqs", endpoint_url="${endpoint}", region_name="REGION",`,
    `                   aws_access_key_id="${keyId}", aws_secret_access_key="SECRET-ACCESS-KEY")`,
    `url = sqs.create_queue(QueueName="orders")["QueueUrl"]`,
    `sqs.send_message(QueueUrl=url, MessageBody="Hello from boto3")`,
    `print(sqs.list_queues(QueueNamePrefix="ord")["QueueUrls"])`,
  ].join("\n");
  const cli = [
    `export AWS_ACCESS_KEY_ID=${keyId} AWS_SECRET_ACCESS_KEY=SECRET-ACCESS-KEY AWS_DEFAULT_REGION=REGION`,
    `aws sqs create-queue --queue-name orders --endpoint-url ${endpoint}`,
    `aws sqs list-queues --endpoint-url ${endpoint}`,
  ].join("\n");
  return [codeExample(`${prefix}-python`, "h3", "Python (boto3)", python),
    codeExample(`${prefix}-cli`, "h3", "The AWS CLI (aws sqs)", cli)];
}

/** #/sqs-keys: the signed-in account's SQS keys, which make, find and use its queues. */
function renderAccountSqs() {
  stopTimer();
  setTitle("SQS keys");
  const account = session.caller.account;
  const panel = h("div", { id: "account-sqs" }, h("p", { class: "muted" }, "Loading…"));
  show(h("p", {}, h("a", { href: "#/" }, "← All queues")),
    h("h1", { id: "account-sqs-title" }, `SQS keys of account ${account}`), panel);
  const owner = {
    path: `/v1/accounts/${encodeURIComponent(account)}/sqs-keys`,
    intro: "Code written against Amazon SQS reaches every queue of this account at the control plane's SQS " +
      "endpoint, signing with a key made here: it can make, list, tag and delete queues (an admin key), " +
      "and send and receive as its role allows. REGION is one this cluster runs queues in.",
    reads: "Every role may find and list the account's queues and read their tags; an admin key also makes, " +
      "tags and deletes them.",
    caption: "The account's SQS keys",
    load: async () => null,
    notFound: () => false,
    facts: (_, endpoint) => [h("dl", { class: "facts" },
      h("dt", {}, "Endpoint"), h("dd", {}, h("code", { id: "sqs-endpoint" }, endpoint)))],
    examples: (_, endpoint) => [h("h2", {}, "Examples"),
      h("p", {}, "ACCESS-KEY-ID and SECRET-ACCESS-KEY stand for a key made here, shown when it was made."),
      ...accountSqsExamples("sqs-example", endpoint, "ACCESS-KEY-ID")],
    madeExamples: (made) => [h("p", {}, "SECRET-ACCESS-KEY stands for the secret above."),
      ...accountSqsExamples("sqs-new", made.endpoint, made.access_key_id)],
  };
  sqsKeyPage(owner, panel);
}

// ---- the operator's builds and rollouts (docs/deploy.md §14.2) -----------------------------

/** How often the page looks again while a rollout rolls. */
const ROLLING_REFRESH_MS = 2_000;

/** A build's hash as people compare them: its first 12 characters. */
function shortHash(sha256) {
  return sha256 ? `${sha256.slice(0, 12)}…` : "—";
}

/** Publishes the file picked as a node build: the binary is the request's body. */
async function publishBuild(file, label) {
  const query = label ? `?label=${encodeURIComponent(label)}` : "";
  const response = await fetch(`/v1/builds${query}`, {
    method: "POST", credentials: "same-origin", cache: "no-store", body: file,
    headers: { Accept: "application/json", "Content-Type": "application/octet-stream",
      "X-CSRF-Token": session.csrf || "" },
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiFailure(response.status, error.code, error.message);
  }
  return data;
}

function renderFleet() {
  stopTimer();
  setTitle("Builds and rollouts");
  const outcome = h("p", { id: "fleet-outcome", role: "status", "aria-live": "polite" });
  const builds = h("tbody", { id: "build-rows" });
  const rollouts = h("tbody", { id: "rollout-rows" });
  const buildChoice = h("select", { id: "rollout-build", required: true });
  const canaryChoice = h("select", { id: "rollout-canary" });
  const pause = h("input", { id: "rollout-pause", type: "number", min: "0", max: "86400", value: "60" });
  const file = h("input", { id: "build-file", type: "file", required: true });
  const label = h("input", { id: "build-label", type: "text", maxlength: "100" });
  let rolling = false;

  async function act(id, action) {
    try {
      const rollout = await api("POST", `/v1/rollouts/${encodeURIComponent(id)}/${action}`);
      outcome.textContent = `Rollout ${id} is ${rollout.state}.`;
    } catch (failure) {
      outcome.textContent = `Refused: ${failure.message}`;
    }
    load();
  }

  function rolloutRow(rollout) {
    const actions = h("td", { "data-label": "Actions" });
    const button = (action, text, cls) => h("button", { type: "button", class: cls,
      "data-action": action, "aria-label": `${text} rollout ${rollout.id}`,
      onclick: () => act(rollout.id, action) }, text);
    if (rollout.state === "rolling") actions.append(button("halt", "Halt", "danger"));
    if (rollout.state === "halted") actions.append(button("resume", "Resume", ""), button("rollback", "Roll back", "danger"));
    if (rollout.state === "done") actions.append(button("rollback", "Roll back", "danger"));
    const steps = Object.entries(rollout.queues)
      .map(([queue, step]) => `${queue}: ${step.step}`).join(", ");
    return h("tr", { "data-rollout": rollout.id },
      h("th", { scope: "row", "data-label": "Rollout" }, rollout.id),
      h("td", { "data-label": "State" }, h("span", { class: `status status-${rollout.state}`, "data-state": rollout.state }, rollout.state)),
      h("td", { "data-label": "Build" }, shortHash(rollout.build.binary_sha256)),
      h("td", { "data-label": "Wave", class: "num" }, `${Math.min(rollout.wave, rollout.waves.length)} of ${rollout.waves.length}`),
      h("td", { "data-label": "Queues", class: "steps" }, steps),
      h("td", { "data-label": "Why", class: "reason" }, rollout.reason || ""),
      actions);
  }

  async function load() {
    let listed, history, queues;
    try {
      [listed, history, queues] = await Promise.all([
        api("GET", "/v1/builds"), api("GET", "/v1/rollouts"), api("GET", "/v1/queues")]);
    } catch (failure) {
      outcome.textContent = `Could not load: ${failure.message}`;
      return;
    }
    const known = [];
    if (listed.installed) {
      known.push({ sha256: listed.installed.binary_sha256, size: listed.installed.size, label: "installed" });
    }
    known.push(...listed.builds);
    builds.replaceChildren(...known.map((build) => h("tr", { "data-build": build.sha256 },
      h("th", { scope: "row", "data-label": "SHA-256", title: build.sha256 }, shortHash(build.sha256)),
      h("td", { "data-label": "Label" }, build.label || ""),
      h("td", { "data-label": "CPU" }, build.architecture || ""),
      h("td", { "data-label": "Size", class: "num" }, formatBytes(build.size)))));
    const chosen = buildChoice.value;
    buildChoice.replaceChildren(...known.map((build) =>
      h("option", { value: build.sha256, selected: build.sha256 === chosen },
        `${shortHash(build.sha256)} ${build.label || ""}`)));
    const running = queues.queues.filter((queue) => queue.status === "running");
    const canary = canaryChoice.value;
    canaryChoice.replaceChildren(h("option", { value: "" }, "The first by id"),
      ...running.map((queue) => h("option", { value: queue.id, selected: queue.id === canary }, queue.id)));
    rollouts.replaceChildren(...history.rollouts.map(rolloutRow));
    const nowRolling = history.rollouts.some((rollout) => rollout.state === "rolling");
    if (nowRolling !== rolling) {
      rolling = nowRolling;
      stopTimer();
      if (rolling) timer = setInterval(load, ROLLING_REFRESH_MS);
    }
  }

  const publishForm = h("form", { id: "publish-build", "aria-labelledby": "publish-title" },
    h("h2", { id: "publish-title" }, "Publish a build"),
    h("div", { class: "field" }, h("label", { for: "build-file" }, "The dataplane binary"), file),
    h("div", { class: "field" }, h("label", { for: "build-label" }, "Label (a version, a commit)"), label),
    h("button", { type: "submit", class: "primary", id: "publish" }, "Publish"));
  publishForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files.length) return;
    outcome.textContent = "Publishing…";
    try {
      const build = await publishBuild(file.files[0], label.value.trim());
      outcome.textContent = `Published ${build.sha256} (${build.architecture}).`;
      buildChoice.value = build.sha256;
    } catch (failure) {
      outcome.textContent = `Refused: ${failure.message}`;
    }
    load();
  });
  const rollForm = h("form", { id: "start-rollout", "aria-labelledby": "rollout-title" },
    h("h2", { id: "rollout-title" }, "Roll a build out"),
    h("p", { class: "hint" }, "Every running queue on another build, in waves: the canary alone, then 2, 4, 8… " +
      "It halts at the first node that refuses the build or does not come back on it."),
    h("div", { class: "field" }, h("label", { for: "rollout-build" }, "Build"), buildChoice),
    h("div", { class: "field" }, h("label", { for: "rollout-canary" }, "Canary"), canaryChoice),
    h("div", { class: "field" }, h("label", { for: "rollout-pause" }, "Pause between waves (s)"), pause),
    h("button", { type: "submit", class: "primary", id: "roll-out" }, "Roll out"));
  rollForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const plan = { binary_sha256: buildChoice.value, pause_secs: Number(pause.value) };
    if (canaryChoice.value) plan.canary = canaryChoice.value;
    try {
      const rollout = await api("POST", "/v1/rollouts", plan);
      outcome.textContent = `Rollout ${rollout.id} started over ${Object.keys(rollout.queues).length} queue(s).`;
    } catch (failure) {
      outcome.textContent = `Refused: ${failure.message}`;
    }
    load();
  });
  show(h("h1", {}, "Builds and rollouts"), outcome,
    h("table", { class: "cards", id: "builds" },
      h("caption", {}, "Node builds: the installed one (what new nodes start from) and the published ones"),
      h("thead", {}, h("tr", {}, ["SHA-256", "Label", "CPU", "Size"].map((name) => h("th", { scope: "col" }, name)))),
      builds),
    publishForm, rollForm,
    h("table", { class: "cards", id: "rollouts" },
      h("caption", {}, "Rollouts, newest first"),
      h("thead", {}, h("tr", {}, ["Rollout", "State", "Build", "Wave", "Queues", "Why"].map((name) =>
        h("th", { scope: "col" }, name)), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
      rollouts));
  load();
}

// ---- routing and start -------------------------------------------------------------------

function route() {
  if (!session.caller) { renderSignIn(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "queues" && parts[1]) renderQueue(parts[1], parts[2] || "overview");
  else if (parts[0] === "fleet" && session.caller.kind === "operator") renderFleet();
  else if (parts[0] === "sqs-keys" && session.caller.kind === "account") renderAccountSqs();
  else renderList();
  if (document.activeElement === document.body || !document.activeElement) {
    document.getElementById("main").focus();
  }
}

async function start() {
  try {
    const reply = await api("GET", "/console/session");
    session.caller = reply.caller;
    session.csrf = reply.csrf || null;
  } catch (_) {
    session.caller = null;
  }
  renderWho();
  window.addEventListener("hashchange", route);
  route();
}

start();
