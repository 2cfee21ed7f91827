// herald dashboard: plain JS against the JSON API under /v1.
// Every string from the API is shown with textContent (never as HTML).
"use strict";

const TOKEN_KEY = "herald.token";
const REFRESH_MS = 2000;
const HISTORY = 150; // samples kept for the charts (5 minutes at 2 s)

const $ = (id) => document.getElementById(id);
const history = [];
let refreshing = false;
let lastOk = null;

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

// ---- the API -----------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return this.status ? `HTTP ${this.status} ${this.code}: ${this.message}` : this.message;
  }
}

async function api(method, path, json) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const init = { method, headers, cache: "no-store" };
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiFailure(0, "unreachable", `cannot reach the herald server (${e.message || e}); is it running?`);
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (_) {
    body = null;
  }
  if (!response.ok) {
    if (body && body.error) {
      throw new ApiFailure(response.status, body.error.code, body.error.message);
    }
    throw new ApiFailure(response.status, "http_error", text || response.statusText);
  }
  if (body === null) {
    throw new ApiFailure(response.status, "not_json", `${method} ${path} answered something that is not JSON: ${text.slice(0, 300)}`);
  }
  return body;
}

// ---- errors: shown verbatim, until they go away ------------------------

// The refresh's errors are replaced on every refresh; an action's error
// stays until dismissed.
function showErrors(kind, list) {
  const box = $("errors");
  for (const el of [...box.querySelectorAll(`[data-kind="${kind}"]`)]) el.remove();
  for (const { what, error } of list) addError(kind, what, error);
}

function addError(kind, what, error) {
  const div = document.createElement("div");
  div.className = "error";
  div.dataset.kind = kind;
  div.dataset.testid = "error";
  const w = document.createElement("span");
  w.className = "what";
  w.textContent = what;
  const m = document.createElement("span");
  m.className = "msg";
  m.textContent = String(error);
  div.append(w, m);
  if (kind === "action") {
    const close = document.createElement("button");
    close.type = "button";
    close.textContent = "dismiss";
    close.onclick = () => div.remove();
    const when = document.createElement("span");
    when.className = "hint";
    when.textContent = new Date().toLocaleTimeString();
    div.append(when, close);
  }
  $("errors").append(div);
}

function setStatus(kind, text) {
  const s = $("status");
  s.className = "pill pill-" + kind;
  s.textContent = text;
}

// ---- the token ---------------------------------------------------------

function showTokenState(needsToken) {
  const st = $("token-state");
  if (token()) {
    st.textContent = "token saved in this browser";
  } else if (needsToken) {
    st.textContent = "this server needs a token";
  } else {
    st.textContent = "no token needed (open loopback mode)";
  }
  $("token-forget").disabled = !token();
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("token").value.trim();
  if (!t) return;
  localStorage.setItem(TOKEN_KEY, t);
  $("token").value = "";
  showTokenState(false);
  refresh();
});

// Emit to a topic: one event per subscribed handler (the API's answer is
// shown as it is, a 422 no_subscribers included).
$("topic-emit").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const tenant = $("topic-emit-tenant").value.trim();
  const topic = $("topic-emit-topic").value.trim();
  const out = $("topic-emit-result");
  let payload;
  try {
    payload = JSON.parse($("topic-emit-payload").value || "null");
  } catch (e) {
    out.textContent = `the payload is not JSON: ${e.message}`;
    return;
  }
  const path = `/v1/tenants/${encodeURIComponent(tenant)}/topics/${encodeURIComponent(topic)}/events`;
  const button = $("topic-emit-send");
  button.disabled = true;
  try {
    const r = await api("POST", path, { payload });
    out.textContent = `${r.events.length} event${r.events.length === 1 ? "" : "s"}: ` +
      r.events.map((e) => `${e.handler} ${e.id}${e.created ? "" : " (existing)"}`).join(", ");
    out.dataset.ids = r.events.map((e) => e.id).join(" ");
  } catch (e) {
    out.textContent = "";
    addError("action", `emit to topic ${topic} failed (POST ${path})`, e);
  } finally {
    button.disabled = false;
  }
  await refresh();
});

$("token-forget").addEventListener("click", () => {
  localStorage.removeItem(TOKEN_KEY);
  showTokenState(false);
  refresh();
});

// ---- refresh -----------------------------------------------------------

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const [stats, rules, dead, topics, schedules] = await Promise.allSettled([
      api("GET", "/v1/stats"),
      api("GET", "/v1/rules"),
      api("GET", "/v1/events?state=dead&limit=200"),
      api("GET", "/v1/topics"),
      api("GET", "/v1/schedules"),
    ]);
    const errors = [];
    if (stats.status === "rejected") errors.push({ what: "GET /v1/stats", error: stats.reason });
    if (rules.status === "rejected") errors.push({ what: "GET /v1/rules", error: rules.reason });
    if (dead.status === "rejected") errors.push({ what: "GET /v1/events?state=dead", error: dead.reason });
    if (topics.status === "rejected") errors.push({ what: "GET /v1/topics", error: topics.reason });
    if (schedules.status === "rejected") errors.push({ what: "GET /v1/schedules", error: schedules.reason });
    showErrors("refresh", errors);
    const needsToken = errors.some((e) => e.error && e.error.status === 401);
    showTokenState(needsToken);
    if (needsToken) $("token").focus();

    if (stats.status === "fulfilled") {
      renderHandlers(stats.value, rules.status === "fulfilled" ? rules.value.rules : []);
      recordActivity(stats.value.recent);
    } else {
      renderUnavailable("handlers-body", 7, "handlers unavailable: see the error above");
      recordActivity(undefined);
    }
    if (schedules.status === "fulfilled") {
      renderSchedules(schedules.value.schedules || []);
    } else {
      renderUnavailable("schedules-body", 10, "schedules unavailable: see the error above");
    }
    if (dead.status === "fulfilled") {
      renderDead(dead.value);
    } else {
      renderUnavailable("dead-body", 8, "dead events unavailable: see the error above");
    }
    if (topics.status === "fulfilled") {
      renderTopics(topics.value.subscriptions);
    } else {
      renderUnavailable("topics-body", 3, "topics unavailable: see the error above");
    }
    if (errors.length === 0) {
      lastOk = new Date();
      setStatus("ok", "live · updated " + lastOk.toLocaleTimeString());
    } else {
      const since = lastOk ? " · last good " + lastOk.toLocaleTimeString() : "";
      setStatus("bad", (needsToken ? "needs a token" : "ERROR") + since);
    }
  } finally {
    refreshing = false;
  }
}

function renderUnavailable(bodyId, cols, text) {
  const tbody = $(bodyId);
  tbody.replaceChildren(row([cell(text, "empty", cols)]));
}

function cell(content, cls, colspan) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  if (colspan) td.colSpan = colspan;
  if (content instanceof Node) td.append(content);
  else if (content !== undefined && content !== null) td.textContent = String(content);
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function badge(kind, text, title) {
  const b = document.createElement("span");
  b.className = "badge badge-" + kind;
  b.dataset.testid = "badge-" + kind;
  b.textContent = text;
  if (title) b.title = title;
  return b;
}

// ---- handlers ----------------------------------------------------------

function renderHandlers(stats, rules) {
  const rows = new Map();
  const key = (t, h) => JSON.stringify([t, h]);
  const get = (t, h) => {
    const k = key(t, h);
    if (!rows.has(k)) rows.set(k, { tenant: t, handler: h, waiting: 0, running: 0, delayed: 0, held: 0, dead: 0, done: 0, estimated: false, paused: false, blocked: false });
    return rows.get(k);
  };
  for (const c of stats.by_handler || []) {
    Object.assign(get(c.tenant, c.handler), c);
  }
  // A rule on a (tenant, handler) without events still gets a row.
  for (const rule of rules) {
    const r = get(rule.tenant, rule.handler);
    if (rule.kind === "pause") r.paused = true;
    if (rule.kind === "block") r.blocked = true;
  }
  const served = Array.isArray(stats.handlers) ? new Set(stats.handlers) : null;
  const list = [...rows.values()].sort((a, b) =>
    a.tenant < b.tenant ? -1 : a.tenant > b.tenant ? 1 : a.handler < b.handler ? -1 : a.handler > b.handler ? 1 : 0);

  const tbody = $("handlers-body");
  if (list.length === 0) {
    tbody.replaceChildren(row([cell("no events and no rules yet", "empty", 10)]));
    return;
  }
  tbody.replaceChildren(...list.map((r) => {
    const state = document.createElement("span");
    if (r.blocked) state.append(badge("blocked", "BLOCKED"));
    if (r.paused) state.append(badge("paused", "PAUSED"));
    // "not held" says that no rule holds the events, not that anything
    // runs: beside "not run by this server", "running" read as a contradiction.
    if (!r.blocked && !r.paused) state.append(badge("unheld", "not held", "no pause or block holds these events"));
    if (served && !served.has(r.handler)) state.append(badge("noworker", "not run by this server", "this server has no handler of this name; another server may run it"));

    const btn = document.createElement("button");
    btn.type = "button";
    if (r.paused) {
      btn.className = "unpause";
      btn.textContent = "Unpause";
      btn.dataset.action = "unpause";
    } else {
      btn.className = "pause";
      btn.textContent = "Pause";
      btn.dataset.action = "pause";
    }
    const path = `/v1/tenants/${encodeURIComponent(r.tenant)}/handlers/${encodeURIComponent(r.handler)}/pause`;
    btn.onclick = () => act(btn, r.paused ? "DELETE" : "PUT", path, `${btn.textContent} ${r.tenant} / ${r.handler}`);

    // "~": extrapolated beyond the counted cap (see GET /v1/stats).
    const n = (v) => (r.estimated ? "~" : "") + v;
    const tr = row([
      cell(r.tenant, "mono"),
      cell(r.handler, "mono"),
      cell(n(r.waiting), "num"),
      cell(n(r.running), "num"),
      cell(n(r.delayed), "num"),
      cell(n(r.held), "num"),
      cell(n(r.dead), r.dead > 0 ? "num hot" : "num"),
      cell(n(r.done), "num"),
      cell(state),
      cell(btn),
    ]);
    ["tenant", "handler", "waiting", "running", "delayed", "held", "dead", "done", "state", "action"]
      .forEach((col, i) => { tr.children[i].dataset.col = col; });
    tr.dataset.tenant = r.tenant;
    tr.dataset.handler = r.handler;
    tr.dataset.testid = "handler-row";
    if (r.paused || r.blocked) tr.className = "held";
    return tr;
  }));
}

// ---- schedules ---------------------------------------------------------

function renderSchedules(list) {
  const tbody = $("schedules-body");
  if (list.length === 0) {
    tbody.replaceChildren(row([cell("no schedules", "empty", 10)]));
    return;
  }
  tbody.replaceChildren(...list.map((s) => {
    const cadence = s.cron != null ? `cron ${s.cron}` : `every ${s.every}`;
    const state = document.createElement("span");
    state.append(s.paused ? badge("paused", "PAUSED") : badge("unheld", "active"));
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = s.paused ? "unpause" : "pause";
    btn.textContent = s.paused ? "Resume" : "Pause";
    btn.dataset.action = s.paused ? "resume" : "pause";
    const path = `/v1/tenants/${encodeURIComponent(s.tenant)}/schedules/${encodeURIComponent(s.name)}/${btn.dataset.action}`;
    btn.onclick = () => act(btn, "POST", path, `${btn.textContent} schedule ${s.tenant} / ${s.name}`);
    const tr = row([
      cell(s.tenant, "mono"),
      cell(s.name, "mono"),
      cell(s.handler, "mono"),
      cell(cadence, "mono"),
      cell(s.timezone, "mono"),
      cell(s.next_at_local == null ? "never" : s.next_at_local, "mono"),
      cell(s.last_occurrence_local == null ? "–" : s.last_occurrence_local, "mono"),
      cell(s.last_event_id == null ? "–" : s.last_event_id, "mono"),
      cell(state),
      cell(btn),
    ]);
    ["tenant", "name", "handler", "cadence", "zone", "next", "last", "last_event", "state", "action"]
      .forEach((col, i) => { tr.children[i].dataset.col = col; });
    tr.dataset.tenant = s.tenant;
    tr.dataset.name = s.name;
    tr.dataset.testid = "schedule-row";
    if (s.paused) tr.className = "held";
    return tr;
  }));
}

// ---- dead events -------------------------------------------------------

function renderDead(page) {
  const tbody = $("dead-body");
  $("dead-note").textContent = page.next ? `(showing the first ${page.events.length}; there are more)` : `(${page.events.length})`;
  if (page.events.length === 0) {
    tbody.replaceChildren(row([cell("no dead events", "empty", 8)]));
    return;
  }
  tbody.replaceChildren(...page.events.map((e) => {
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "retry";
    btn.textContent = "Retry";
    btn.dataset.action = "retry";
    btn.onclick = () => act(btn, "POST", `/v1/events/${encodeURIComponent(e.id)}/retry`, `Retry ${e.id}`);
    const err = document.createElement("pre");
    err.textContent = e.last_error == null ? "(no error recorded)" : e.last_error;
    const tr = row([
      cell(e.id, "mono"),
      cell(e.tenant, "mono"),
      cell(e.handler, "mono"),
      cell(e.topic == null ? "" : e.topic, "mono"),
      cell(`${e.attempt}/${e.max_attempts}`, "num"),
      cell(e.updated_at, "mono"),
      cell(err, "err"),
      cell(btn),
    ]);
    tr.dataset.id = e.id;
    tr.dataset.testid = "dead-row";
    return tr;
  }));
}

// ---- topics ------------------------------------------------------------

function renderTopics(subscriptions) {
  const tbody = $("topics-body");
  const topics = new Set(subscriptions.map((s) => s.topic));
  $("topics-note").textContent = `(${topics.size} topic${topics.size === 1 ? "" : "s"}, ${subscriptions.length} subscription${subscriptions.length === 1 ? "" : "s"})`;
  if (subscriptions.length === 0) {
    tbody.replaceChildren(row([cell("no subscriptions: emits to a topic are refused until a handler subscribes", "empty", 3)]));
    return;
  }
  tbody.replaceChildren(...subscriptions.map((s) => {
    const tr = row([
      cell(s.topic, "mono"),
      s.tenant == null ? cell(badge("unheld", "every tenant")) : cell(s.tenant, "mono"),
      cell(s.handler, "mono"),
    ]);
    tr.dataset.testid = "subscription-row";
    return tr;
  }));
}

// ---- actions -----------------------------------------------------------

async function act(button, method, path, what) {
  button.disabled = true;
  const label = button.textContent;
  button.textContent = label + "…";
  try {
    await api(method, path);
  } catch (e) {
    addError("action", `${what} failed (${method} ${path})`, e);
    button.disabled = false;
    button.textContent = label;
    return;
  }
  await refresh();
}

// ---- activity charts ---------------------------------------------------

function recordActivity(recent) {
  const note = $("activity-note");
  if (recent === null) {
    note.hidden = false;
    note.textContent = "Server-wide activity is shown to the operator token only; this is a tenant token.";
  } else {
    note.hidden = true;
  }
  if (recent) {
    const lat = recent.emit_to_start_seconds || {};
    history.push({
      t: Date.now(),
      done: recent.done_per_second,
      failed: recent.failed_per_second,
      p50: lat.p50,
      p99: lat.p99,
    });
    $("window-note").textContent = `(each point: the last ${recent.window_seconds} s; ${lat.samples ?? 0} runs started)`;
    $("now-done").textContent = fmt(recent.done_per_second);
    $("now-failed").textContent = fmt(recent.failed_per_second);
    $("now-p50").textContent = lat.p50 == null ? "no runs" : fmtSeconds(lat.p50);
    $("now-p99").textContent = lat.p99 == null ? "no runs" : fmtSeconds(lat.p99);
  } else {
    // A gap: the chart shows where data is missing.
    history.push({ t: Date.now(), done: null, failed: null, p50: null, p99: null });
  }
  while (history.length > HISTORY) history.shift();
  drawChart($("chart-throughput"), [["done", "l-done"], ["failed", "l-failed"]], fmt);
  drawChart($("chart-latency"), [["p50", "l-p50"], ["p99", "l-p99"]], fmtSeconds);
}

function fmt(x) {
  if (x == null) return "–";
  if (x === 0) return "0";
  if (x >= 100) return x.toFixed(0);
  if (x >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

function fmtSeconds(s) {
  if (s == null) return "–";
  if (s === 0) return "0 s";
  if (s < 0.001) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 0) + " ms";
  if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + " s";
  return (s / 60).toFixed(1) + " min";
}

function ago(seconds) {
  return seconds < 120 ? `${Math.round(seconds)} s ago` : `${Math.round(seconds / 60)} min ago`;
}

const SVG = "http://www.w3.org/2000/svg";
function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function drawChart(svg, series, format) {
  const W = Math.max(200, Math.round(svg.clientWidth || 600));
  const H = 180;
  const left = 64, right = 10, top = 10, bottom = 22;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const parts = [];
  let max = 0;
  for (const p of history) for (const [k] of series) if (p[k] != null && p[k] > max) max = p[k];
  const hasData = history.some((p) => series.some(([k]) => p[k] != null));
  if (max === 0) max = 1;
  max *= 1.1;
  const plotW = W - left - right, plotH = H - top - bottom;
  // The x axis spans the history kept, at least a minute: a young chart
  // is not squeezed into the right edge.
  const slots = Math.min(HISTORY, Math.max(30, history.length));
  const x = (i) => left + (i + (slots - history.length)) * plotW / (slots - 1);
  const y = (v) => top + plotH - (v / max) * plotH;
  for (const f of [0, 0.5, 1]) {
    const v = max * f;
    parts.push(svgEl("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
    parts.push(svgEl("text", { class: "axis", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, format(v)));
  }
  parts.push(svgEl("text", { class: "axis", x: left, y: H - 6 }, ago(slots * REFRESH_MS / 1000)));
  parts.push(svgEl("text", { class: "axis", x: W - right, y: H - 6, "text-anchor": "end" }, "now"));
  for (const [k, cls] of series) {
    // One polyline per run of known values, so gaps stay visible.
    let pts = [];
    const flush = () => {
      if (pts.length === 1) pts.push(pts[0]);
      if (pts.length) parts.push(svgEl("polyline", { class: cls, points: pts.join(" ") }));
      pts = [];
    };
    history.forEach((p, i) => {
      if (p[k] == null) flush();
      else pts.push(`${x(i).toFixed(1)},${y(p[k]).toFixed(1)}`);
    });
    flush();
  }
  if (!hasData) {
    parts.push(svgEl("text", { class: "nodata", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
  }
  svg.replaceChildren(...parts);
}

// ---- start -------------------------------------------------------------

window.addEventListener("unhandledrejection", (ev) => addError("action", "dashboard bug", ev.reason));
window.addEventListener("error", (ev) => addError("action", "dashboard bug", ev.message));
showTokenState(false);
refresh();
setInterval(refresh, REFRESH_MS);
