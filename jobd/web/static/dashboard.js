// jobd dashboard: fetches /api/overview every few seconds and draws it. No dependencies.
"use strict";

const REFRESH_MS = 5000;
const TOKEN_KEY = "jobd.token";
let csrf = "";
let now = Date.now() / 1000;  // the time of the last overview
let lastActions = false;  // whether the last overview said actions are on

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

function api(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  return fetch(path, Object.assign({}, options, {headers, cache: "no-store", credentials: "omit"}));
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// Replace the children of node by those given that are not null.
function fill(node, ...children) {
  node.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return seconds.toFixed(1) + "s";
  if (seconds < 7200) return (seconds / 60).toFixed(1) + "m";
  return (seconds / 3600).toFixed(1) + "h";
}

function seconds(value) {
  return value < 1 ? (value * 1000) + "ms" : value + "s";
}

function bound(value, top) {
  if (value === null || value === undefined) return "–";
  if (value === "+Inf") return "> " + seconds(top);
  return "≤ " + seconds(value);
}

function percentiles(p, top) {
  return ["p50", "p90", "p99"].map((k) => `${k} ${bound(p[k], top)}`).join(" · ");
}

function sparkline(series) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 240 48");
  const max = Math.max(1, ...series.done, ...series.failed);
  for (const name of ["done", "failed"]) {
    const points = series[name].map((v, i) =>
      `${(i * 240 / Math.max(1, series[name].length - 1)).toFixed(1)},${(46 - v * 44 / max).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", name);
    line.setAttribute("points", points.join(" "));
    svg.append(line);
  }
  return svg;
}

function figure(value, label) {
  return el("div", {class: "figure"}, el("b", {}, value), el("span", {}, label));
}

// A POST action (/api/PATH), with the CSRF value the API gave; what it did, or null (the
// reason shown). The page is redrawn after.
async function act(path, body) {
  const reply = await api("/api/" + path, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Jobd-CSRF": csrf},
    body: JSON.stringify(body),
  });
  const data = await reply.json();
  if (!reply.ok) notify("jobd: " + data.error, true);
  refresh();
  return reply.ok ? data : null;
}

// A line under the header: what an action did, or why it was refused.
function notify(text, bad) {
  const notice = document.getElementById("notice");
  notice.textContent = text;
  notice.className = bad ? "bad" : "";
  notice.hidden = false;
}

function when(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "–";
  return new Date(unixSeconds * 1000).toLocaleString();
}

// "in 3.0m" / "4.1s ago": from the time of the last overview (the server's clock).
function relative(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "";
  const delta = unixSeconds - now;
  return delta >= 0 ? "in " + age(delta) : age(-delta) + " ago";
}

// A record's field as shown, marked where the server cut it (stderr keeps its tail).
function cut(record, name) {
  const text = record[name] || "";
  if (!(record.cut || []).includes(name)) return text;
  return name === "stderr" ? "…" + text : text + "…";
}

function deadLetters(name, records, actions) {
  if (!records.length) return el("p", {class: "muted"}, "No dead letters.");
  const head = el("tr", {}, ...["job", "error", "exit", "attempts", "failed", "stderr (tail)"]
    .map((h) => el("th", {}, h)), actions ? el("th", {}, "") : null);
  const rows = records.map((r) => el("tr", {},
    el("td", {class: "job"}, cut(r, "job_id"),
       r.payload !== undefined ? el("pre", {}, cut(r, "payload")) : null,
       r.bad ? el("div", {class: "bad"}, "bad record: " + r.bad) : null),
    el("td", {class: "error"}, cut(r, "error")),
    el("td", {class: "num"}, r.exit_code ?? (r.signal ? "signal " + r.signal : "–")),
    el("td", {class: "num"}, r.attempts),
    el("td", {}, r.failed_at === null ? "–" : new Date(r.failed_at * 1000).toLocaleString()),
    el("td", {}, el("pre", {}, cut(r, "stderr"))),
    actions ? el("td", {}, el("button", {onclick: () => act("dead-letters/requeue", {queue: name, ids: [r.id]})},
                              "requeue")) : null));
  const table = el("table", {}, head, ...rows);
  if (!actions) return table;
  return el("div", {}, table,
    el("button", {onclick: () => act("dead-letters/requeue", {queue: name, all: true})}, "requeue all"), " ",
    el("button", {onclick: () => confirm(`Purge every dead letter of ${name}?`) &&
                                act("dead-letters/purge", {queue: name})}, "purge"));
}

function queueSection(name, q, actions) {
  const hour = q.hour;
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const done = sum(hour.series.done), failed = sum(hour.series.failed);
  const running = q.consumers.reduce((a, c) => a + c.holding, 0);
  const section = el("section", {class: q.paused ? "queue paused" : "queue", id: "queue-" + name},
    el("h2", {}, name, q.paused ? el("span", {class: "badge"}, "PAUSED") : null,
       el("small", {}, `stream ${q.stream} · group ${q.group}`),
       actions ? pauseButton(name, q.paused) : null));
  if (q.paused) {
    section.append(el("p", {class: "paused-note"},
      `Paused since ${when(q.paused.since)} (${relative(q.paused.since)}) by ${q.paused.by}: ` +
      "no daemon starts a new job of it until it is resumed; running jobs finish."));
  }
  section.append(el("div", {class: "figures"},
    figure(q.length, "in stream"), figure(q.lag ?? "–", "backlog (lag)"),
    figure(q.pending, "pending"), figure(age(q.oldest_pending_age), "oldest pending"),
    figure(running, "running"), figure(q.delayed, "delayed"),
    figure(q.dead_lettered, "dead-lettered"),
    figure(done, "done, last hour"),
    figure(done + failed ? (100 * failed / (done + failed)).toFixed(1) + "%" : "–",
           "failure rate, last hour")));
  const p = hour.percentiles;
  section.append(el("div", {class: "charts"},
    el("div", {class: "chart"}, el("span", {}, "done (green) and failed (red) per minute, last hour"),
       sparkline(hour.series)),
    el("div", {class: "chart"}, el("span", {}, "enqueue → start"),
       percentiles(p.wait, hour.top_bucket)),
    el("div", {class: "chart"}, el("span", {}, "handler duration"),
       percentiles(p.run, hour.top_bucket))));
  if (q.levels) {
    section.append(el("h3", {}, "Priority levels"), el("table", {},
      el("tr", {}, ...["level", "backlog", "pending", "delayed"].map((h) => el("th", {}, h))),
      ...Object.entries(q.levels).map(([level, b]) => el("tr", {}, el("td", {}, level),
        el("td", {class: "num"}, b.lag ?? "–"), el("td", {class: "num"}, b.pending),
        el("td", {class: "num"}, b.delayed)))));
  }
  const waiting = (q.limits && q.limits.waiting) || {};
  section.append(el("h3", {}, "Consumers"), q.consumers.length ? el("table", {},
    el("tr", {}, ...["consumer", "idle", "jobs held", ""].map((h) => el("th", {}, h))),
    ...q.consumers.map((c) => el("tr", {}, el("td", {}, c.name),
      el("td", {class: "num"}, age(c.idle)), el("td", {class: "num"}, c.holding),
      el("td", {class: "waiting"}, waiting[c.name] ? "waiting for a " + waiting[c.name].for : ""))))
    : el("p", {class: "muted"}, "No consumers yet."));
  section.append(el("h3", {}, "Next delayed"), nextDelayed(q.next_delayed, q.delayed));
  section.append(el("h3", {}, "Dead letters"), deadLetters(name, q.dead_letters, actions));
  return section;
}

function pauseButton(name, paused) {
  const action = paused ? "resume" : "pause";
  return el("button", {class: "control", onclick: async () => {
    const done = await act(action, {queue: name});
    if (done) notify(paused ? `resumed ${name}` : `paused ${name}: no daemon starts a new job of it`);
  }}, paused ? "Resume" : "Pause");
}

// The jobs due soonest (a few, of every priority level), never their payloads.
function nextDelayed(jobs, total) {
  if (!jobs.length) return el("p", {class: "muted"}, "No delayed jobs.");
  const rows = jobs.map((j) => el("tr", {},
    el("td", {class: "job"}, j.job_id ?? "(its entry id once due)",
       j.bad ? el("div", {class: "bad"}, "not a job: " + j.bad) : null),
    el("td", {}, when(j.due), " ", el("span", {class: "muted"}, relative(j.due))),
    el("td", {class: "num"}, j.attempt), el("td", {}, j.level ?? "")));
  const more = total > jobs.length ? el("p", {class: "muted"}, `… of ${total} delayed`) : null;
  return el("div", {}, el("table", {},
    el("tr", {}, ...["job", "due", "attempt", "level"].map((h) => el("th", {}, h))), ...rows), more);
}

// The jobs running now, of every queue, oldest first; each with a Cancel button (actions on).
function runningPanel(queues, actions) {
  const panel = document.getElementById("running");
  const jobs = Object.entries(queues).flatMap(([name, q]) =>
    (q.running_jobs || []).map((job) => [name, job]));
  jobs.sort((a, b) => (a[1].since ?? 0) - (b[1].since ?? 0));
  const head = el("tr", {}, ...["queue", "job", "consumer", "since", "attempt", "deadline"]
    .map((h) => el("th", {}, h)), actions ? el("th", {}, "") : null);
  const rows = jobs.map(([name, j]) => el("tr", {"data-job": j.job_id},
    el("td", {}, name), el("td", {class: "job"}, j.job_id),
    el("td", {}, j.consumer, el("div", {class: "muted"}, `${j.host} · pid ${j.pid ?? "–"}`)),
    el("td", {}, when(j.since), " ", el("span", {class: "muted"}, relative(j.since))),
    el("td", {class: "num"}, j.attempt ?? "–"),
    el("td", {class: j.deadline !== null && j.deadline < now ? "past" : ""},
       when(j.deadline), " ", el("span", {class: "muted"}, relative(j.deadline))),
    actions ? el("td", {}, cancelButton(name, j)) : null));
  panel.hidden = false;
  panel.replaceChildren(el("h2", {}, "Running jobs"), jobs.length ? el("table", {}, head, ...rows)
    : el("p", {class: "muted"}, "No job is running."));
}

function cancelButton(queue, job) {
  if (job.inexact) return el("span", {class: "muted"}, "(jobd cancel)");
  return el("button", {onclick: () => cancelJob(queue, job.job_id)}, "Cancel");
}

async function cancelJob(queue, jobId) {
  if (!confirm(`Cancel job ${jobId} of ${queue}? A running handler is stopped.`)) return;
  const done = await act("cancel", {queue, job_ids: [jobId]});
  if (done) notify(done.found.map((f) => `cancel ${f.job_id}: ${f.said}`).join("; "));
}

// The job lookup: a queue and a job id; where the job is now and its history.
function lookupPanel(queues) {
  const panel = document.getElementById("lookup");
  const names = Object.keys(queues);
  let select = document.getElementById("lookup-queue");
  if (!select) {
    select = el("select", {id: "lookup-queue"});
    const input = el("input", {id: "lookup-id", size: 36, placeholder: "job id", autocomplete: "off"});
    const form = el("form", {onsubmit: (event) => {
      event.preventDefault();
      lookup(select.value, input.value.trim());
    }}, el("label", {for: "lookup-id"}, "Job"), select, input, el("button", {type: "submit"}, "look up"));
    panel.replaceChildren(el("h2", {}, "Find a job"), form, el("div", {id: "job"}));
    panel.hidden = false;
  }
  if ([...select.options].map((o) => o.value).join("\n") !== names.join("\n")) {
    const chosen = select.value;
    select.replaceChildren(...names.map((name) => el("option", {value: name}, name)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

async function lookup(queue, jobId) {
  const out = document.getElementById("job");
  if (!jobId) return out.replaceChildren();
  const reply = await api("/api/job?" + new URLSearchParams({queue, id: jobId}));
  const data = await reply.json();
  if (!reply.ok) return out.replaceChildren(el("p", {class: "error"}, data.error));
  fill(out, el("p", {class: "state"}, el("b", {}, data.job_id), ` of ${data.queue}: `,
    el("span", {class: "state-" + data.state}, data.state), stateDetail(data),
    lastActions && ["running", "waiting", "delayed"].includes(data.state)
      ? el("span", {}, " ", cancelButton(data.queue, data)) : null),
  data.records.length ? historyTable(data.records)
    : el("p", {class: "muted"}, "No history of this job (never settled here, or trimmed)."),
  data.skipped ? el("p", {class: "bad"}, `${data.skipped} line(s) of its history are no record`)
    : null);
}

function stateDetail(job) {
  const r = job.running;
  if (r) return ` on ${r.consumer} (${r.host}, pid ${r.pid ?? "–"}) since ${when(r.since)},` +
    ` attempt ${r.attempt ?? "–"}, deadline ${when(r.deadline)}`;
  if (job.state === "delayed") return ` until ${when(job.due)} (${relative(job.due)})`;
  if (job.state === "waiting" && job.entry) {
    return ` as entry ${job.entry} of ${job.stream}` + (job.consumer ? `, held by ${job.consumer}` : "");
  }
  return "";
}

function historyTable(records) {
  const head = el("tr", {}, ...["at", "event", "attempt", "consumer", "exit", "error", "took", "detail"]
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

// The events feed: the newest events of every queue, newest first, kept across refreshes.
let eventCursor = null;
let events = [];
const EVENTS_KEPT = 50;

async function refreshEvents() {
  const query = eventCursor ? "?" + new URLSearchParams({after: JSON.stringify(eventCursor)}) : "";
  const reply = await api("/api/events" + query);
  const data = await reply.json();
  if (!reply.ok) throw new Error(data.error);
  eventCursor = data.after;
  const seen = new Set(events.map((e) => e.queue + " " + e.id));
  const fresh = data.events.filter((e) => !seen.has(e.queue + " " + e.id));
  events = (data.skipped ? data.events : events.concat(fresh))
    .sort((a, b) => b.at - a.at || (b.id > a.id ? 1 : -1)).slice(0, EVENTS_KEPT);
  const panel = document.getElementById("events");
  panel.hidden = false;
  const head = el("tr", {}, ...["at", "queue", "event", "job", "who", "detail"].map((h) => el("th", {}, h)));
  const rows = events.map((e) => el("tr", {},
    el("td", {class: "when"}, new Date(e.at * 1000).toLocaleTimeString()), el("td", {}, e.queue),
    el("td", {class: "event-" + (e.fields.event || "")}, e.fields.event || "?"),
    el("td", {class: "job"}, e.fields.job || ""), el("td", {}, e.fields.by || e.fields.consumer || ""),
    el("td", {}, eventDetail(e.fields))));
  fill(panel, el("h2", {}, "Events"),
    data.skipped ? el("p", {class: "muted"}, "(more came than shown: the newest are)") : null,
    events.length ? el("table", {}, head, ...rows) : el("p", {class: "muted"}, "No events yet."));
}

function eventDetail(fields) {
  const shown = ["attempt", "error", "exit_code", "signal", "duration_ms", "due", "owner", "count",
                 "new_entry", "entry"];
  return shown.filter((k) => fields[k] !== undefined && fields[k] !== "")
    .map((k) => `${k} ${k === "due" ? when(Number(fields[k]) / 1000) : fields[k]}`).join(" · ");
}

// Every paused queue, above everything else: since when and by whom.
function pausedBanner(queues) {
  const banner = document.getElementById("paused");
  const paused = Object.entries(queues).filter(([, q]) => q.paused);
  banner.hidden = !paused.length;
  banner.replaceChildren(...paused.map(([name, q]) => el("div", {},
    el("b", {}, "PAUSED "), name, ` since ${when(q.paused.since)} by ${q.paused.by}`)));
}

// Asked for when the API wants a token this tab does not have (or a wrong one).
function askToken() {
  const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  for (const id of ["paused", "lookup", "running", "events"]) {
    document.getElementById(id).hidden = true;
    if (id !== "paused") document.getElementById(id).replaceChildren();
  }
  eventCursor = null;
  events = [];
  document.getElementById("updated").textContent = refused ? "that token was refused" : "";
  if (document.getElementById("token")) return;  // being typed: left alone
  const input = el("input", {type: "password", id: "token", autocomplete: "off", size: 40});
  const form = el("form", {onsubmit: (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    refresh();
  }}, el("p", {}, "This dashboard needs its token: open /#token=TOKEN, or give it here."),
  input, " ", el("button", {type: "submit"}, "show"));
  document.getElementById("queues").replaceChildren(form);
  input.focus();
}

async function refresh() {
  try {
    const reply = await api("/api/overview");
    const data = await reply.json();
    if (reply.status === 401) return askToken();
    if (!reply.ok) throw new Error(data.error);
    csrf = data.csrf;
    now = data.time;
    document.getElementById("where").textContent = data.redis;
    document.getElementById("updated").textContent =
      "updated " + new Date(data.time * 1000).toLocaleTimeString();
    lastActions = data.actions;
    pausedBanner(data.queues);
    lookupPanel(data.queues);
    runningPanel(data.queues, data.actions);
    const main = document.getElementById("queues");
    main.replaceChildren(...Object.entries(data.queues)
      .map(([name, q]) => queueSection(name, q, data.actions)));
    await refreshEvents();
  } catch (error) {
    document.getElementById("updated").textContent = "not updated: " + error.message;
  }
}

takeToken();
refresh();
window.addEventListener("hashchange", () => takeToken() && refresh());  // pasted on this page
setInterval(refresh, REFRESH_MS);
