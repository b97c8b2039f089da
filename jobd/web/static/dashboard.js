// jobd dashboard: an overview of every queue (#/), a page per queue (#/queue/NAME[/STATE]) and a
// page per job (#/job/QUEUE/ID). No dependencies, nothing from the network but its own API.
// Everything Redis holds goes into text nodes (el(): String children, never markup).
"use strict";

const DAEMONS_MS = 1000;  // the daemons list: a stopped daemon leaves it within ~1 s
const REFRESH_MS = 5000;  // the rest: the summary, a queue's figures, a job
const TOKEN_KEY = "jobd.token";
const CANCEL_MAX = 100;  // job ids a cancel request takes (jobd.web.actions.MAX_JOB_IDS)
const REQUEUE_MAX = 1000;  // record ids a requeue request takes (jobd.web.actions.MAX_IDS)
const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
const SVG = "http://www.w3.org/2000/svg";
let csrf = "";
let now = Date.now() / 1000;  // the server's time at the last reply
let lastActions = false;  // whether the last summary said actions are on
let route = {page: "overview"};
let queueView = null;  // the queue page's state: its tab, cursors, search, selection
let sortBy = {key: "name", down: false};
let lastSummary = null;

// The token, when the dashboard has one. It comes in the address's fragment (/#token=TOKEN:
// a fragment is sent to no server), is kept in this tab's sessionStorage (this origin only:
// no other port of the host can read it), is dropped from the address bar, and goes with
// every call as "Authorization: Bearer". Never in a cookie: cookies go to every port.
function takeToken() {
  const match = /^#token=(.+)$/.exec(location.hash);
  if (!match) return false;
  let token = match[1];
  try { token = decodeURIComponent(token); } catch (error) { /* kept as written */ }
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}

// A reply's token: the one its request went with (a 401 is about that one, not another).
const SENT = new WeakMap();

async function api(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const reply = await fetch(path, Object.assign({}, options, {headers, cache: "no-store", credentials: "omit"}));
  SENT.set(reply, token);
  return reply;
}

// A reply 401: the token it went with is asked for again, unless the tab has another since
// (a refresh sent before the token came in answers after it: it says nothing of the new one).
function refused(reply) {
  if (sessionStorage.getItem(TOKEN_KEY) === SENT.get(reply)) askToken();
}

// GET an API path: its JSON, or null when the token is wanted (the page asks for it).
async function get(path, query) {
  const reply = await api(path + (query ? "?" + new URLSearchParams(query) : ""));
  const data = await reply.json();
  if (reply.status === 401) { refused(reply); return null; }
  if (!reply.ok) throw new Error(data.error);
  if (typeof data.time === "number") now = data.time;
  return data;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined));
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return seconds.toFixed(1) + "s";
  if (seconds < 7200) return (seconds / 60).toFixed(1) + "m";
  return (seconds / 3600).toFixed(1) + "h";
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return Math.round(s * 1000) + "ms";
  if (s < 120) return (Math.round(s * 10) / 10) + "s";
  return (Math.round(s / 6) / 10) + "m";
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

// Times in the browser's zone, the zone shown.
function when(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "–";
  return new Date(unixSeconds * 1000).toLocaleString(undefined, {timeZoneName: "short"});
}

function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString(undefined, {hour: "2-digit", minute: "2-digit"});
}

// "in 3.0m" / "4.1s ago": from the time of the last reply (the server's clock).
function relative(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "";
  const delta = unixSeconds - now;
  return delta >= 0 ? "in " + age(delta) : age(-delta) + " ago";
}

function figure(value, label) {
  return el("div", {class: "figure"}, el("b", {}, value), el("span", {}, label));
}

// A job id as a link to its page (one the page cannot name back exactly: as text).
function jobLink(queue, job) {
  if (job.inexact || !job.job_id) return job.job_id ?? "";
  return el("a", {href: `#/job/${encodeURIComponent(queue)}/${encodeURIComponent(job.job_id)}`}, job.job_id);
}

function queueLink(name) {
  return el("a", {href: "#/queue/" + encodeURIComponent(name)}, name);
}

// A POST action (/api/PATH), with the CSRF value the API gave; what it did, or null (the
// reason shown). The page is redrawn after.
async function act(path, body) {
  const data = await post(path, body);
  refresh(true);
  return data;
}

async function post(path, body) {
  const reply = await api("/api/" + path, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Jobd-CSRF": csrf},
    body: JSON.stringify(body),
  });
  const data = await reply.json();
  if (!reply.ok) notify("jobd: " + data.error, true);
  return reply.ok ? data : null;
}

// An action on a selection larger than one request takes (the API's limit: 100 job ids a
// cancel, 1000 records a requeue): every id, in requests of ``limit`` one after the other. What
// each request did is passed to ``said``; the ids sent are dropped from the selection as their
// request succeeds, so a refusal part way leaves the rest selected (and says how many). The
// page is redrawn after.
async function actInChunks(view, path, body, key, ids, limit, said) {
  const lines = [];
  for (let i = 0; i < ids.length; i += limit) {
    const chunk = ids.slice(i, i + limit);
    const data = await post(path, {...body, [key]: chunk});
    if (!data) {
      const left = ids.length - i;
      const before = lines.length ? lines.join("; ") + "; " : "";
      notify(`${before}stopped: ${left} of ${ids.length} not sent, still selected`, true);
      refresh(true);
      return;
    }
    lines.push(said(data));
    chunk.forEach((id) => view.selected.delete(id));
  }
  notify(lines.join("; "));
  refresh(true);
}

// A line under the header: what an action did, or why it was refused.
function notify(text, bad) {
  const notice = document.getElementById("notice");
  notice.textContent = text;
  notice.className = bad ? "bad" : "";
  notice.hidden = false;
}

// A record's field as shown, marked where the server cut it (stderr keeps its tail).
function cut(record, name) {
  const text = record[name] || "";
  if (!(record.cut || []).includes(name)) return text;
  return name === "stderr" ? "…" + text : text + "…";
}

// -- the header and the overview --------------------------------------------------------------

function header(data) {
  document.getElementById("where").textContent = data.redis;
  const s = data.server || {};
  document.getElementById("server").textContent = s.error ? s.error : [
    "Redis " + (s.redis_version ?? "?"), s.role ?? "?",
    "memory " + bytes(s.used_memory) + " / " + (s.maxmemory ? bytes(s.maxmemory) : "no max"),
    (s.connected_clients ?? "?") + " clients",
    "AOF " + (s.aof_enabled ? "on" : "off") + ", RDB saved " +
      (s.rdb_last_save_time ? when(s.rdb_last_save_time) : "never") +
      (s.rdb_last_bgsave_status && s.rdb_last_bgsave_status !== "ok" ? " (last save " + s.rdb_last_bgsave_status + ")" : ""),
  ].join(" · ");
  document.getElementById("updated").textContent =
    `updated ${new Date(data.time * 1000).toLocaleTimeString()} · times in ${ZONE}`;
}

// Every paused queue, above everything else: since when and by whom.
function pausedBanner(queues) {
  const banner = document.getElementById("paused");
  const paused = Object.entries(queues).filter(([, q]) => q.paused);
  banner.hidden = !paused.length;
  banner.replaceChildren(...paused.map(([name, q]) => el("div", {},
    el("b", {}, "PAUSED "), name, ` since ${when(q.paused.since)} by ${q.paused.by}`)));
}

const COLUMNS = [
  ["name", "queue"], ["state", "state"], ["backlog", "backlog", true],
  ["oldest_pending_age", "oldest pending", true], ["running", "running / slots", true],
  ["done_per_minute", "done / min", true], ["failed_per_minute", "failed / min", true],
  ["dead_lettered", "dead letters", true], ["delayed", "delayed", true], ["paused", "paused"],
];

function sortValue(name, row, key) {
  if (key === "name") return name;
  if (key === "paused") return row.paused ? row.paused.since : -1;
  const value = row[key];
  return value === null || value === undefined ? -1 : value;
}

function queueTable(queues) {
  const rows = Object.entries(queues);
  const {key, down} = sortBy;
  rows.sort(([a, x], [b, y]) => {
    const p = sortValue(a, x, key), q = sortValue(b, y, key);
    const order = p < q ? -1 : p > q ? 1 : a < b ? -1 : a > b ? 1 : 0;
    return down ? -order : order;
  });
  const head = el("tr", {}, COLUMNS.map(([k, label, num]) => el("th", {
    class: "sort" + (num ? " num" : ""), "data-key": k, "aria-sort": k === key ? (down ? "descending" : "ascending") : "none",
    onclick: () => { sortBy = {key: k, down: k === key ? !down : !!num}; drawOverview(lastSummary); },
  }, label, k === key ? (down ? " ▾" : " ▴") : "")));
  const body = rows.map(([name, q]) => el("tr", {"data-queue": name,
    onclick: (event) => { if (event.target.tagName !== "A") location.hash = "#/queue/" + encodeURIComponent(name); }},
    el("td", {}, queueLink(name), q.levels ? el("div", {class: "muted"}, "levels " + q.levels.join(", ")) : null),
    el("td", {class: "state-" + q.state}, q.state),
    el("td", {class: "num"}, q.lag_known ? q.backlog : "–"),
    el("td", {class: "num"}, age(q.oldest_pending_age)),
    el("td", {class: "num"}, `${q.running_at_most ? "≤ " : ""}${q.running} / ${q.concurrency}`),
    el("td", {class: "num"}, q.done_per_minute), el("td", {class: "num"}, q.failed_per_minute),
    el("td", {class: "num"}, q.dead_lettered ?? "–"), el("td", {class: "num"}, q.delayed),
    el("td", {}, q.paused ? `since ${when(q.paused.since)} by ${q.paused.by}` : "")));
  return el("section", {class: "panel", id: "queue-list"},
    el("h2", {}, `Queues (${rows.length})`, el("small", {}, "done and failed: the last whole minute; click a row for the queue")),
    el("table", {id: "queue-table"}, el("thead", {}, head), el("tbody", {}, body)));
}

function drawOverview(data) {
  if (!data || route.page !== "overview") return;
  document.getElementById("queues").replaceChildren(queueTable(data.queues));
  lookupPanel(data.queues);
}

async function refreshSummary() {
  const data = await get("/api/summary");
  if (!data) return;
  csrf = data.csrf;
  lastActions = data.actions;
  lastSummary = data;
  header(data);
  pausedBanner(data.queues);
  drawOverview(data);
  if (route.page === "overview") await refreshEvents();
}

// Every daemon in the registry, with its last heartbeat (the server's time); a dead or stale
// one marked, and whatever is wrong with its record.
async function refreshDaemons() {
  const data = await get("/api/daemons");
  if (!data) return;
  const panel = document.getElementById("daemons");
  const head = el("tr", {}, ["daemon", "state", "last beat", "host · pid", "version", "queues",
    "running", "started"].map((h) => el("th", {}, h)));
  const rows = data.daemons.map((d) => el("tr", {"data-daemon": d.name},
    el("td", {}, d.name, d.problems.map((p) => el("div", {class: "bad"}, p))),
    el("td", {class: "state-" + d.state}, d.state),
    el("td", {class: "num"}, age(d.since_beat) + " ago"),
    el("td", {}, `${d.host ?? "–"} · ${d.pid ?? "–"}`), el("td", {}, d.version ?? "–"),
    el("td", {}, [...new Set(d.queues.map((q) => q.name))].join(", ")),
    el("td", {class: "num"}, `${d.running ?? "–"}/${d.slots ?? "–"}`),
    el("td", {}, when(d.started))));
  panel.hidden = route.page !== "overview";
  fill(panel, el("h2", {}, `Daemons (${data.daemons.length})`), data.error ? el("p", {class: "bad"}, data.error) : null,
    data.daemons.length ? el("table", {}, head, ...rows) : el("p", {class: "muted"}, "No daemon is running."));
}

// The job lookup: a queue and a job id, opening the job's page.
function lookupPanel(queues) {
  const panel = document.getElementById("lookup");
  const names = Object.keys(queues);
  let select = document.getElementById("lookup-queue");
  if (!select) {
    select = el("select", {id: "lookup-queue"});
    const input = el("input", {id: "lookup-id", size: 36, placeholder: "job id", autocomplete: "off"});
    const form = el("form", {onsubmit: (event) => {
      event.preventDefault();
      const id = input.value.trim();
      if (id) location.hash = `#/job/${encodeURIComponent(select.value)}/${encodeURIComponent(id)}`;
    }}, el("label", {for: "lookup-id"}, "Job"), select, input, el("button", {type: "submit"}, "look up"));
    panel.replaceChildren(el("h2", {}, "Find a job"), form);
  }
  panel.hidden = false;
  if ([...select.options].map((o) => o.value).join("\n") !== names.join("\n")) {
    const chosen = select.value;
    select.replaceChildren(...names.map((name) => el("option", {value: name}, name)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

// -- charts: inline SVG, axes labelled ---------------------------------------------------------

function niceTop(value) {
  if (!(value > 0)) return 1;
  const unit = Math.pow(10, Math.floor(Math.log10(value)));
  for (const f of [1, 2, 2.5, 5, 10]) if (f * unit >= value) return f * unit;
  return 10 * unit;
}

// A line chart of per-minute values: x the time (the browser's zone), y what ``yLabel`` says.
// ``lines``: [{name, label, values}] (a null value: no data that minute, the line breaks).
function chart(id, title, minutes, lines, yLabel, format, least) {
  const W = 560, H = 220, L = 66, R = 24, T = 24, B = 42;
  const all = lines.flatMap((l) => l.values).filter((v) => v !== null && v !== undefined);
  const top = niceTop(Math.max(least || 0, ...all));
  const x = (i) => L + (i * (W - L - R)) / Math.max(1, minutes.length - 1);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const root = svg("svg", {class: "chart", id, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title});
  root.append(svg("text", {x: L, y: 15, class: "title"}, title));
  for (let k = 0; k <= 4; k++) {
    const v = (top * k) / 4;
    root.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v)}),
      svg("text", {class: "y-tick", x: L - 6, y: y(v) + 4, "text-anchor": "end"}, format(v)));
  }
  minutes.forEach((m, i) => {
    if (i % 15 !== 0 && i !== minutes.length - 1) return;
    root.append(svg("line", {class: "tick", x1: x(i), x2: x(i), y1: H - B, y2: H - B + 4}),
      svg("text", {class: "x-tick", x: x(i), y: H - B + 16,
        "text-anchor": i === minutes.length - 1 ? "end" : "middle"}, clock(m)));
  });
  root.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}),
    svg("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}),
    svg("text", {class: "x-label", x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle"},
      `time (${ZONE}), one point a minute`),
    svg("text", {class: "y-label", transform: `translate(12 ${(T + H - B) / 2}) rotate(-90)`,
      "text-anchor": "middle"}, yLabel));
  for (const line of lines) {
    let points = [];
    const flush = () => {
      if (points.length) root.append(svg("polyline", {class: line.name, points: points.join(" ")}));
      points = [];
    };
    line.values.forEach((v, i) => {
      if (v === null || v === undefined) return flush();
      points.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
      if (v) root.append(svg("circle", {class: line.name, cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2}));
    });
    flush();
  }
  const legend = el("div", {class: "legend"}, lines.map((l) =>
    el("span", {}, el("i", {class: "key-" + l.name}), l.label)));
  return el("div", {class: "chart"}, root, legend);
}

function charts(hour) {
  const count = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
  const est = hour.estimated.run;
  const said = ["p50", "p90", "p99"].map((p) => `${p} ${duration(est[p])}`).join(" · ");
  return el("div", {class: "charts"},
    chart("chart-throughput", "Throughput, last hour", hour.minutes,
      [{name: "done", label: "done", values: hour.series.done},
       {name: "failed", label: "failed", values: hour.series.failed}], "jobs per minute", count, 4),
    chart("chart-latency", `Run time, last hour (hour: ${said})`, hour.minutes,
      ["p50", "p90", "p99"].map((p) => ({name: p, label: p, values: hour.latency[p]})),
      "run time (interpolated)", (v) => duration(v)));
}

// -- the queue page ---------------------------------------------------------------------------

const TABS = [["waiting", "waiting"], ["running", "running"], ["delayed", "delayed / retrying"],
  ["dead", "dead letters"], ["recent", "recently settled"]];

function openQueue(name, tab) {
  if (!queueView || queueView.name !== name) {
    queueView = {name, tab: tab || "waiting", level: null, find: "", cursors: [""], selected: new Set(), data: null, page: null};
    const section = el("section", {class: "queue", id: "queue-" + name},
      el("div", {class: "head"}), el("div", {class: "figures"}), el("div", {class: "charts-box"}),
      el("div", {class: "more"}), el("div", {class: "jobs", id: "jobs"}));
    document.getElementById("queues").replaceChildren(section);
  } else if (tab && tab !== queueView.tab) {
    Object.assign(queueView, {tab, cursors: [""], selected: new Set(), find: ""});
  }
}

async function refreshQueue(full) {
  const view = queueView;
  const data = await get("/api/queue", {queue: view.name});
  if (!data || view !== queueView) return;
  view.data = data.status;
  drawQueue(view);
  if (full || !view.selected.size) await loadPage(view);
}

function drawQueue(view) {
  const q = view.data, name = view.name;
  const section = document.getElementById("queue-" + name);
  if (!section) return;
  section.className = q.paused ? "queue paused" : "queue";
  const hour = q.hour;
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const done = sum(hour.series.done), failed = sum(hour.series.failed);
  fill(section.querySelector(".head"),
    el("h2", {}, name, q.paused ? el("span", {class: "badge"}, "PAUSED") : null,
      el("small", {}, `stream ${q.stream} · group ${q.group}`), lastActions ? pauseButton(name, q.paused) : null),
    q.paused ? el("p", {class: "paused-note"},
      `Paused since ${when(q.paused.since)} (${relative(q.paused.since)}) by ${q.paused.by}: ` +
      "no daemon starts a new job of it until it is resumed; running jobs finish.") : null,
    (q.errors || []).map((e) => el("p", {class: "bad"}, e)));
  fill(section.querySelector(".figures"),
    figure(q.length, "in stream"), figure(q.lag === null ? (q.lag_at_most == null ? "–" : "≤ " + q.lag_at_most) : q.lag, "backlog (lag)"),
    figure(q.pending ?? "–", "pending"), figure(age(q.oldest_pending_age), "oldest pending"),
    figure(`${q.running_at_most ? "≤ " : ""}${q.running_count} / ${q.concurrency}`, "running / concurrency (config)"),
    figure(q.delayed ?? "–", "delayed"), figure(q.dead_lettered ?? "–", "dead-lettered"),
    figure(done, "done, last hour"),
    figure(done + failed ? (100 * failed / (done + failed)).toFixed(1) + "%" : "–", "failure rate, last hour"),
    figure(duration(hour.estimated.wait.p50), "enqueue → start, p50"));
  fill(section.querySelector(".charts-box"), charts(hour));
  const waiting = (q.limits && q.limits.waiting) || {};
  const serving = (q.daemons || []).map((d) => `${d.name} (${d.state})`).join(", ");
  fill(section.querySelector(".more"),
    q.levels ? [el("h3", {}, "Priority levels"), el("table", {},
      el("tr", {}, ["level", "backlog", "pending", "oldest pending", "delayed"].map((h) => el("th", {}, h))),
      Object.entries(q.levels).map(([level, b]) => el("tr", {}, el("td", {}, level),
        el("td", {class: "num"}, b.lag ?? "–"), el("td", {class: "num"}, b.pending ?? "–"),
        el("td", {class: "num"}, age(b.oldest_pending_age)),
        el("td", {class: "num"}, b.delayed ?? "–"))))] : null,
    el("h3", {}, "Consumers"), q.consumers_listed === false
      ? el("p", {class: "muted"}, `${q.consumers_count} consumers: not listed (more than 256: the daemons table lists jobd's)`)
      : null, q.consumers.length ? el("table", {},
      el("tr", {}, ["consumer", "idle", "jobs held", ""].map((h) => el("th", {}, h))),
      q.consumers.map((c) => el("tr", {}, el("td", {}, c.name_cut ? `${c.name}… (${c.name_length} bytes)` : c.name),
        el("td", {class: "num"}, age(c.idle)), el("td", {class: "num"}, c.holding),
        el("td", {class: "waiting"}, waiting[c.name] ? "waiting for a " + waiting[c.name].for : ""))))
      : q.consumers_listed === false ? null : el("p", {class: "muted"}, "No consumers yet."),
    el("p", {class: "muted"}, "Daemons serving it: " + (serving || "none")));
}

function pauseButton(name, paused) {
  const action = paused ? "resume" : "pause";
  return el("button", {class: "control", onclick: async () => {
    const done = await act(action, {queue: name});
    if (done) notify(paused ? `resumed ${name}` : `paused ${name}: no daemon starts a new job of it`);
  }}, paused ? "Resume" : "Pause");
}

function tabCount(q, tab) {
  if (!q) return "";
  const n = {waiting: q.lag, running: q.running_count, delayed: q.delayed, dead: q.dead_lettered, recent: q.recent_count}[tab];
  return n === null || n === undefined ? "" : ` (${n})`;
}

async function loadPage(view) {
  const query = {queue: view.name, state: view.tab, count: "50"};
  const cursor = view.cursors[view.cursors.length - 1];
  if (cursor) query.cursor = cursor;
  if (view.find) query.find = view.find;
  if (view.level) query.level = view.level;
  const page = await get("/api/jobs", query);
  if (!page || view !== queueView) return;
  view.page = page;
  drawJobs(view);
}

function drawJobs(view) {
  const box = document.getElementById("jobs");
  if (!box) return;
  const page = view.page, q = view.data;
  const tabs = el("div", {class: "tabs", role: "tablist"}, TABS.map(([tab, label]) => el("button", {
    class: tab === view.tab ? "on" : "", "data-tab": tab, role: "tab",
    onclick: () => { location.hash = `#/queue/${encodeURIComponent(view.name)}/${tab}`; },
  }, label + tabCount(q, tab))));
  // Redrawn every refresh: what someone is typing into the box stays, with its caret and focus.
  const was = document.getElementById("find");
  const typing = was && document.activeElement === was
    ? {value: was.value, start: was.selectionStart, end: was.selectionEnd} : null;
  const input = el("input", {id: "find", size: 28, placeholder: "job id holds…", autocomplete: "off", value: typing ? typing.value : view.find});
  const search = el("form", {class: "tools", onsubmit: (event) => {
    event.preventDefault();
    Object.assign(view, {find: input.value.trim(), cursors: [""], selected: new Set()});
    loadPage(view);
  }}, el("label", {for: "find"}, "Find"), input, el("button", {type: "submit"}, "find"),
  view.find ? el("button", {type: "button", onclick: () => {
    Object.assign(view, {find: "", cursors: [""], selected: new Set()});
    loadPage(view);
  }}, "clear") : null,
  levelSelect(view), bulkButtons(view));
  const pager = el("div", {class: "tools"},
    el("button", {disabled: view.cursors.length === 1 ? "disabled" : null, onclick: () => { view.cursors = [""]; loadPage(view); }}, "« first"),
    el("button", {disabled: view.cursors.length === 1 ? "disabled" : null, onclick: () => { view.cursors.pop(); loadPage(view); }}, "‹ previous"),
    el("span", {class: "muted", id: "page-number"}, `page ${view.cursors.length}`),
    el("button", {disabled: page.cursor ? null : "disabled", id: "next-page", onclick: () => { view.cursors.push(page.cursor); loadPage(view); }},
      view.find && !page.jobs.length ? "search further ›" : "next ›"));
  const unread = page.unread ? el("p", {class: "bad"}, `… ${page.unread} running records not read (a page reads at most 1 000, 1 MiB)`) : null;
  fill(box, tabs, search, jobsTable(view), unread, pager);
  if (typing) {
    input.value = typing.value;
    input.focus();
    input.setSelectionRange(typing.start, typing.end);
  }
}

function levelSelect(view) {
  const names = (view.data && view.data.levels_names) || [];
  if (!names.length || !["waiting", "delayed"].includes(view.tab)) return null;
  const select = el("select", {id: "level", onchange: () => {
    Object.assign(view, {level: select.value, cursors: [""], selected: new Set()});
    loadPage(view);
  }}, names.map((n) => el("option", {value: n}, "level " + n)));
  select.value = view.level || names[0];
  return select;
}

function bulkButtons(view) {
  if (!lastActions || view.tab === "recent") return null;
  const n = view.selected.size;
  const chosen = [...view.selected];
  if (view.tab === "dead") {
    return [
      el("button", {type: "button", id: "requeue-selected", disabled: n ? null : "disabled", onclick: async () => {
        if (!confirm(`Requeue ${n} dead letter(s) of ${view.name}?`)) return;
        await actInChunks(view, "dead-letters/requeue", {queue: view.name}, "ids", chosen, REQUEUE_MAX,
          (done) => `requeued ${done.requeued.length} dead letter(s) of ${view.name}`);
      }}, `Requeue selected (${n})`),
      el("button", {type: "button", onclick: async () => {
        if (!confirm(`Requeue every dead letter of ${view.name}?`)) return;
        const done = await act("dead-letters/requeue", {queue: view.name, all: true});
        if (done) notify(`requeued ${done.requeued.length} dead letter(s) of ${view.name}`);
      }}, "Requeue all"),
      el("button", {type: "button", onclick: () => confirm(`Purge every dead letter of ${view.name}?`) &&
        act("dead-letters/purge", {queue: view.name})}, "Purge all")];
  }
  return el("button", {type: "button", id: "cancel-selected", disabled: n ? null : "disabled", onclick: async () => {
    if (!confirm(`Cancel ${n} job(s) of ${view.name}? A running handler is stopped.`)) return;
    await actInChunks(view, "cancel", {queue: view.name}, "job_ids", chosen, CANCEL_MAX,
      (done) => done.found.map((f) => `cancel ${f.job_id}: ${f.said}`).join("; "));
  }}, `Cancel selected (${n})`);
}

function selectBox(view, key) {
  if (!lastActions || view.tab === "recent") return null;
  if (key === null) return el("td", {}, "");
  return el("td", {}, el("input", {type: "checkbox", "data-key": key, checked: view.selected.has(key) ? "checked" : null,
    "aria-label": "select", onchange: (event) => {
      if (event.target.checked) view.selected.add(key); else view.selected.delete(key);
      drawJobs(view);
    }}));
}

const HEADS = {
  waiting: ["job", "entry", "enqueued", "attempt"],
  running: ["job", "progress · status", "state", "consumer", "since", "attempt", "deadline"],
  delayed: ["job", "due", "attempt", "level"],
  dead: ["job", "error", "exit", "attempts", "failed", "stderr (tail)", ""],
  recent: ["job", "last record", "at", "attempt", "exit", "error", "took", "consumer"],
};
const EMPTY = {waiting: "No job is waiting.", running: "No job is running.", delayed: "No delayed jobs.",
  dead: "No dead letters.", recent: "No job in the history."};

function jobsTable(view) {
  const jobs = view.page.jobs, name = view.name, tab = view.tab;
  if (view.page.error) return el("p", {class: "bad"}, view.page.error);
  if (!jobs.length) {
    return el("p", {class: "muted"}, view.find ? `No ${tab} job whose id holds "${view.find}" here.` : EMPTY[tab]);
  }
  const acting = lastActions && tab !== "recent";
  const head = el("tr", {}, acting ? el("th", {}, "") : null, HEADS[tab].map((h) => el("th", {}, h)));
  const rows = jobs.map((j) => {
    const key = tab === "dead" ? j.id : j.inexact || !j.job_id ? null : j.job_id;
    return el("tr", {"data-job": j.job_id ?? "", "data-id": j.id ?? j.entry ?? null}, selectBox(view, key), ROW[tab](name, j));
  });
  return el("table", {id: "jobs-" + tab}, head, rows);
}

const ROW = {
  waiting: (name, j) => [el("td", {class: "job"}, jobLink(name, j), unshown(j)), el("td", {}, j.entry),
    el("td", {}, when(j.enqueued), " ", el("span", {class: "muted"}, relative(j.enqueued))),
    el("td", {class: "num"}, j.attempt)],
  running: (name, j) => [el("td", {class: "job"}, jobLink(name, j)), toldCell(j),
    el("td", {class: j.cancelling ? "state-cancelling" : "state-busy"}, j.cancelling ? "cancelling" : "running"),
    el("td", {}, j.consumer, el("div", {class: "muted"}, `${j.host} · pid ${j.pid ?? "–"}`)),
    el("td", {}, when(j.since), " ", el("span", {class: "muted"}, relative(j.since))),
    el("td", {class: "num"}, j.attempt ?? "–"),
    el("td", {class: j.deadline !== null && j.deadline < now ? "past" : ""},
      when(j.deadline), " ", el("span", {class: "muted"}, relative(j.deadline)))],
  delayed: (name, j) => [el("td", {class: "job"}, j.job_id ? jobLink(name, j) : "(its entry id once due)",
      j.bad ? el("div", {class: "bad"}, "not a job: " + j.bad) : null),
    el("td", {}, when(j.due), " ", el("span", {class: "muted"}, relative(j.due))),
    el("td", {class: "num"}, j.attempt ?? "–"), el("td", {}, j.level ?? "")],
  dead: (name, r) => [el("td", {class: "job"}, r.job_id ? jobLink(name, {job_id: cut(r, "job_id"), inexact: r.inexact || (r.cut || []).includes("job_id")}) : "",
      r.payload !== undefined ? el("pre", {}, cut(r, "payload")) : null,
      r.bad ? el("div", {class: "bad"}, "bad record: " + r.bad) : null, unshown(r)),
    el("td", {class: "error"}, cut(r, "error")),
    el("td", {class: "num"}, r.exit_code ?? (r.signal ? "signal " + r.signal : "–")),
    el("td", {class: "num"}, r.attempts),
    el("td", {}, when(r.failed_at)), el("td", {}, el("pre", {}, cut(r, "stderr"))),
    el("td", {}, lastActions ? el("button", {onclick: () => act("dead-letters/requeue", {queue: name, ids: [r.id]})}, "requeue") : "")],
  recent: (name, j) => [el("td", {class: "job"}, jobLink(name, j), j.bad ? el("div", {class: "bad"}, j.bad) : null),
    el("td", {class: "event-" + j.event}, j.event), el("td", {}, when(j.at)),
    el("td", {class: "num"}, j.attempt), el("td", {class: "num"}, j.exit_code || (j.signal ? "signal " + j.signal : "")),
    el("td", {class: "error"}, j.error), el("td", {class: "num"}, j.duration_ms ? duration(Number(j.duration_ms) / 1000) : ""),
    el("td", {}, j.consumer)],
};

// An entry wider than jobd writes one: how many of its fields the page does not show.
function unshown(row) {
  return row.fields_not_shown ? el("div", {class: "bad"}, `… ${row.fields_not_shown} fields not shown`) : null;
}

// What a running job's handler told of itself: a bar for its progress, its status line. Both
// as text: a status is the handler's bytes (not UTF-8 ones escaped by the server), never markup.
function percentText(progress) {
  return (Math.round(progress * 10) / 10) + "%";
}

function toldCell(job) {
  const hasProgress = typeof job.progress === "number";
  const hasStatus = typeof job.status === "string";
  if (!hasProgress && !hasStatus) return el("td", {class: "told muted"}, "–");
  return el("td", {class: "told"},
    hasProgress ? el("div", {class: "bar"},
      el("progress", {max: "100", value: String(job.progress)}),
      el("span", {class: "percent"}, percentText(job.progress))) : null,
    hasStatus ? el("div", {class: "status"}, job.status) : null);
}

// -- the job page -----------------------------------------------------------------------------

function cancelButton(queue, job) {
  if (job.inexact) return el("span", {class: "muted"}, "(jobd cancel)");
  return el("button", {onclick: () => cancelJob(queue, job.job_id)}, "Cancel");
}

async function cancelJob(queue, jobId) {
  if (!confirm(`Cancel job ${jobId} of ${queue}? A running handler is stopped.`)) return;
  const done = await act("cancel", {queue, job_ids: [jobId]});
  if (done) notify(done.found.map((f) => `cancel ${f.job_id}: ${f.said}`).join("; "));
}

async function refreshJob() {
  let page = document.getElementById("job-page");
  if (!page) {
    page = el("section", {class: "panel", id: "job-page"}, el("h2", {}, "Job ", route.id, " of ", queueLink(route.queue)), el("div", {id: "job"}));
    document.getElementById("queues").replaceChildren(page);
  }
  const out = document.getElementById("job");
  const reply = await api("/api/job?" + new URLSearchParams({queue: route.queue, id: route.id}));
  const data = await reply.json();
  if (reply.status === 401) return refused(reply);
  if (!reply.ok) return out.replaceChildren(el("p", {class: "error"}, data.error));
  now = data.now;
  fill(out, el("p", {class: "state"}, el("b", {}, data.job_id), ` of ${data.queue}: `,
    el("span", {class: "state-" + data.state}, data.state), stateDetail(data),
    lastActions && ["running", "waiting", "delayed", "held"].includes(data.state)
      ? el("span", {}, " ", cancelButton(data.queue, data)) : null),
  linksList(data),
  data.records.length ? historyTable(data.records)
    : el("p", {class: "muted"}, "No history of this job (never settled here, or trimmed)."),
  data.skipped ? el("p", {class: "bad"}, `${data.skipped} line(s) of its history are no record`) : null,
  data.records_unread ? el("p", {class: "bad"}, `its history is ${data.records_unread} bytes, more than jobd writes a job (a lookup reads 2 MiB): not read`) : null);
}

// A job named "QUEUE JOB_ID" (a queue name has no space) as a link to its page; as text when
// the server says the name may not be exact (``inexact``: its job id was not UTF-8, escaped).
function namedJob(named, inexact) {
  const at = named.indexOf(" ");
  return at < 0 ? named : jobLink(named.slice(0, at), {job_id: named.slice(at + 1), inexact});
}

function joined(items) {
  return items.flatMap((x, i) => (i ? [", ", x] : [x]));
}

// The job's workflow links (docs: Workflows): its parent, follow-ups, what it waits for, its
// batch (with the batch's progress, read from /api/batch, when it is the batch of that id it
// was a member of; one it left by a requeue, said so).
function linksList(data) {
  const items = [];
  const inexact = new Set(data.links_inexact || []);
  const namedLink = (named) => namedJob(named, inexact.has(named));
  if (data.parent) items.push(["parent", namedLink(data.parent)]);
  const fu = data.follow_ups;
  if (fu) items.push(["follow-ups", ...joined(fu.jobs.map(namedLink)),
    fu.count > fu.jobs.length ? ` … and ${fu.count - fu.jobs.length} more` : ""]);
  const after = data.after;
  if (after) items.push(["after", `${after.left.length} of ${after.all.length} left: `,
    ...joined(after.all.map(namedLink)), after.any ? " (runs after any outcome)" : ""]);
  if (data.batch) {
    const progress = el("span", {class: "muted"});
    if (data.batch_left) progress.textContent = "(left: requeued, a member no more)";
    else batchProgress(data.batch, data.batch_incarnation, progress)
      .catch(() => { progress.textContent = ""; });
    items.push(["batch", data.batch, " ", progress]);
  }
  if (!items.length) return null;
  return el("dl", {class: "links"}, ...items.flatMap(([name, ...what]) => [el("dt", {}, name), el("dd", {}, ...what)]));
}

// A member's batch progress; not when the batch of that id now is another than the one its
// records name (``incarnation``, /api/job's batch_incarnation: `jobd job` says the same).
async function batchProgress(id, incarnation, out) {
  const b = await get("/api/batch", {id});
  if (!b) return;
  if (!b.found) out.textContent = "(no such batch now: expired)";
  else if (incarnation && b.incarnation && incarnation !== b.incarnation) {
    out.textContent = "(an earlier batch of this id: its progress is not kept; `jobd batch` shows a later one)";
  } else out.textContent = `${b.state}: ${b.total} in all, ${b.done} done, ${b.failed} failed, ${b.pending} pending`;
}

function stateDetail(job) {
  const r = job.running;
  if (r) return ` on ${r.consumer} (${r.host}, pid ${r.pid ?? "–"}) since ${when(r.since)},` +
    ` attempt ${r.attempt ?? "–"}, deadline ${when(r.deadline)}` +
    (typeof r.progress === "number" ? `, ${percentText(r.progress)} done` : "") +
    (typeof r.status === "string" ? `, status: ${r.status}` : "");
  if (job.state === "delayed") return ` until ${when(job.due)} (${relative(job.due)})`;
  if (job.state === "waiting" && job.entry) {
    return ` as entry ${job.entry} of ${job.stream}` + (job.consumer ? `, held by ${job.consumer}` : "");
  }
  return "";
}

function historyTable(records) {
  const head = el("tr", {}, ["at", "event", "attempt", "consumer", "exit", "error", "took", "detail"]
    .map((h) => el("th", {}, h)));
  const rows = records.map((rec) => el("tr", {},
    el("td", {}, when(rec.at)), el("td", {class: "event-" + rec.event}, rec.event),
    el("td", {class: "num"}, rec.attempt ?? ""),
    el("td", {}, rec.consumer, rec.host ? el("div", {class: "muted"}, rec.host) : null),
    el("td", {class: "num"}, rec.exit_code ?? (rec.signal ? "signal " + rec.signal : "")),
    el("td", {class: "error"}, rec.error),
    el("td", {class: "num"}, rec.duration_ms === null ? "" : age(rec.duration_ms / 1000)),
    el("td", {}, recordDetail(rec),
       rec.stdout ? el("pre", {}, "stdout: " + rec.stdout) : null,
       rec.stderr ? el("pre", {}, "stderr: " + rec.stderr) : null)));
  return el("table", {}, head, ...rows);
}

function recordDetail(rec) {
  const said = [];
  if (rec.due !== null) said.push("due " + when(rec.due));
  if (rec.by) said.push("by " + rec.by);
  if (rec.new_entry) said.push("as entry " + rec.new_entry);
  if (rec.owner !== "" && rec.event === "lease lost") said.push("held by " + (rec.owner || "no one"));
  return said.join(" · ");
}

// -- the events feed: the newest events of every queue, newest first, kept across refreshes --

let eventCursor = null;
let events = [];
const EVENTS_KEPT = 50;

async function refreshEvents() {
  const data = await get("/api/events", eventCursor ? {after: JSON.stringify(eventCursor)} : null);
  if (!data) return;
  eventCursor = data.after;
  const seen = new Set(events.map((e) => e.queue + " " + e.id));
  const fresh = data.events.filter((e) => !seen.has(e.queue + " " + e.id));
  events = (data.skipped ? data.events : events.concat(fresh))
    .sort((a, b) => b.at - a.at || (b.id > a.id ? 1 : -1)).slice(0, EVENTS_KEPT);
  const panel = document.getElementById("events");
  panel.hidden = route.page !== "overview";
  const head = el("tr", {}, ["at", "queue", "event", "job", "who", "detail"].map((h) => el("th", {}, h)));
  const rows = events.map((e) => el("tr", {},
    el("td", {class: "when"}, new Date(e.at * 1000).toLocaleTimeString()), el("td", {}, e.queue),
    el("td", {class: "event-" + (e.fields.event || "")}, e.fields.event || "?"),
    el("td", {class: "job"}, e.fields.job ? jobLink(e.queue, {job_id: eventField(e, "job"),
      inexact: (e.cut || []).includes("job") || (e.inexact || []).includes("job")}) : ""),
    el("td", {}, eventField(e, "by") || eventField(e, "consumer")), el("td", {}, eventDetail(e))));
  fill(panel, el("h2", {}, "Events"),
    data.skipped ? el("p", {class: "muted"}, "(more came than shown: the newest are)") : null,
    events.length ? el("table", {}, head, ...rows) : el("p", {class: "muted"}, "No events yet."));
}

// An event's field as shown, "…" where the server cut it (256 bytes of each are read).
function eventField(e, name) {
  return cut({...e.fields, cut: e.cut}, name);
}

function eventDetail(e) {
  const fields = e.fields;
  const shown = ["attempt", "error", "exit_code", "signal", "duration_ms", "due", "owner", "count",
                 "new_entry", "entry"];
  const said = shown.filter((k) => fields[k] !== undefined && fields[k] !== "")
    .map((k) => `${k} ${k === "due" ? when(Number(fields[k]) / 1000) : eventField(e, k)}`);
  if (e.fields_not_shown) said.push(`… ${e.fields_not_shown} fields not shown`);
  return said.join(" · ");
}

// -- the token, routes and refreshes ----------------------------------------------------------

// Asked for when the API wants a token this tab does not have (or a wrong one).
function askToken() {
  const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  for (const id of ["paused", "lookup", "daemons", "events"]) {
    document.getElementById(id).hidden = true;
    if (id !== "paused") document.getElementById(id).replaceChildren();
  }
  eventCursor = null;
  events = [];
  queueView = null;
  document.getElementById("updated").textContent = refused ? "that token was refused" : "";
  if (document.getElementById("token")) return;  // being typed: left alone
  const input = el("input", {type: "password", id: "token", autocomplete: "off", size: 40});
  const form = el("form", {onsubmit: (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    refresh(true);
  }}, el("p", {}, "This dashboard needs its token: open /#token=TOKEN, or give it here."),
  input, " ", el("button", {type: "submit"}, "show"));
  document.getElementById("queues").replaceChildren(form);
  input.focus();
}

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map((p) => {
    try { return decodeURIComponent(p); } catch (error) { return p; }
  });
  if (parts[0] === "queue" && parts[1]) return {page: "queue", queue: parts[1], tab: parts[2] || null};
  if (parts[0] === "job" && parts[1] && parts.length >= 3) return {page: "job", queue: parts[1], id: parts.slice(2).join("/")};
  return {page: "overview"};
}

function crumbs() {
  const nav = document.getElementById("crumbs");
  nav.hidden = route.page === "overview";
  if (route.page === "overview") return nav.replaceChildren();
  fill(nav, el("a", {href: "#/"}, "← all queues"),
    route.page === "job" ? [" · ", queueLink(route.queue)] : null);
}

function navigate() {
  if (takeToken()) { refresh(true); return; }
  const was = route;
  route = parseRoute();
  if (route.page !== "queue") queueView = null;
  if (route.page === "queue") openQueue(route.queue, route.tab || (queueView && queueView.tab) || "waiting");
  if (was.page !== route.page || route.page === "job") {
    if (route.page !== "queue") document.getElementById("queues").replaceChildren(el("p", {class: "muted"}, "Loading…"));
  }
  for (const id of ["lookup", "daemons", "events"]) document.getElementById(id).hidden = route.page !== "overview";
  crumbs();
  refresh(true);
}

let ticks = 0;
let running = false;

// Each second: the daemons (on the overview); every fifth, the page's own data. ``full``: now.
async function refresh(full) {
  if (running && !full) return;
  running = true;
  try {
    if (route.page === "overview") await refreshDaemons();
    if (full || ticks % (REFRESH_MS / DAEMONS_MS) === 0) {
      // The summary (every queue) on the overview; elsewhere after an action and every 30 s
      // (the paused banner), not every 5 s: its cost grows with the queues.
      if (route.page === "overview" || full || ticks % 30 === 0) await refreshSummary();
      if (route.page === "queue" && queueView) await refreshQueue(full);
      if (route.page === "job") await refreshJob();
    }
  } catch (error) {
    document.getElementById("updated").textContent = "not updated: " + error.message;
  } finally {
    running = false;
  }
}

takeToken();
route = parseRoute();
navigate();
window.addEventListener("hashchange", navigate);
setInterval(() => { ticks++; refresh(false); }, DAEMONS_MS);
