// jobd dashboard: fetches /api/overview every few seconds and draws it. No dependencies.
"use strict";

const REFRESH_MS = 5000;
const TOKEN_KEY = "jobd.token";
let csrf = "";

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

async function act(action, body) {
  const reply = await api("/api/dead-letters/" + action, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Jobd-CSRF": csrf},
    body: JSON.stringify(body),
  });
  if (!reply.ok) alert("jobd: " + (await reply.json()).error);
  refresh();
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
    actions ? el("td", {}, el("button", {onclick: () => act("requeue", {queue: name, ids: [r.id]})},
                              "requeue")) : null));
  const table = el("table", {}, head, ...rows);
  if (!actions) return table;
  return el("div", {}, table,
    el("button", {onclick: () => act("requeue", {queue: name, all: true})}, "requeue all"), " ",
    el("button", {onclick: () => confirm(`Purge every dead letter of ${name}?`) &&
                                act("purge", {queue: name})}, "purge"));
}

function queueSection(name, q, actions) {
  const hour = q.hour;
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const done = sum(hour.series.done), failed = sum(hour.series.failed);
  const running = q.consumers.reduce((a, c) => a + c.holding, 0);
  const section = el("section", {class: "queue", id: "queue-" + name},
    el("h2", {}, name, el("small", {}, `stream ${q.stream} · group ${q.group}`)));
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
  section.append(el("h3", {}, "Dead letters"), deadLetters(name, q.dead_letters, actions));
  return section;
}

// Asked for when the API wants a token this tab does not have (or a wrong one).
function askToken() {
  const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
  sessionStorage.removeItem(TOKEN_KEY);
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
    document.getElementById("where").textContent = data.redis;
    document.getElementById("updated").textContent =
      "updated " + new Date(data.time * 1000).toLocaleTimeString();
    const main = document.getElementById("queues");
    main.replaceChildren(...Object.entries(data.queues)
      .map(([name, q]) => queueSection(name, q, data.actions)));
  } catch (error) {
    document.getElementById("updated").textContent = "not updated: " + error.message;
  }
}

takeToken();
refresh();
window.addEventListener("hashchange", () => takeToken() && refresh());  // pasted on this page
setInterval(refresh, REFRESH_MS);
