// MQTT broker dashboard: plain JavaScript + uPlot (vendored). Everything comes from /api/*.
// Rendering state for tests and scripts: every .chart gets data-points (points plotted) and
// data-series; #history gets data-state = idle | loading | done | empty | error.
"use strict";

const COLORS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmtNum = (v) => v == null ? "–" : (Math.abs(v) >= 1000 ? Math.round(v).toLocaleString() : (+v.toFixed(2)).toString());
const fmtTime = (t) => t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–";

async function api(path) {
  let res;
  try {
    res = await fetch(path, {headers: {"Accept": "application/json"}, cache: "no-store"});
  } catch (e) {
    throw new Error("the broker does not answer (" + e.message + ")");
  }
  let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) {
    const err = new Error((body && body.error) || ("HTTP " + res.status));
    err.status = res.status;
    throw err;
  }
  return body;
}

// ---- charts ------------------------------------------------------------------------------

class Chart {
  // labels: series names; opts.bars: draw bars; opts.y: y axis label
  constructor(el, labels, opts = {}) {
    this.el = el; this.labels = labels; this.opts = opts; this.plot = null;
  }
  make() {
    const series = [{}].concat(this.labels.map((label, i) => ({
      label, stroke: COLORS[i % COLORS.length], width: 1.5,
      fill: this.opts.bars ? COLORS[i % COLORS.length] + "99" : undefined,
      paths: this.opts.bars ? uPlot.paths.bars({size: [0.8, 40]}) : undefined,
      points: {show: this.opts.points ?? false},
      spanGaps: this.opts.spanGaps ?? false,
    })));
    this.plot = new uPlot({
      width: Math.max(this.el.clientWidth, 300), height: 200, series,
      scales: {x: {time: true}, y: {range: (u, min, max) => [Math.min(0, min ?? 0), Math.max(1, max ?? 1) * 1.1]}},
      axes: [{}, {size: 60, label: this.opts.y || ""}],
      legend: {live: true},
    }, this.empty(), this.el);
  }
  empty() { return [[]].concat(this.labels.map(() => [])); }
  set(data) {
    if (!this.plot) this.make();
    else if (this.el.clientWidth && Math.abs(this.plot.width - this.el.clientWidth) > 2) this.resize();
    this.plot.setData(data);
    const n = data[0].length;
    this.el.dataset.points = String(n);
    this.el.dataset.series = String(data.length - 1);
  }
  resize() { if (this.plot) this.plot.setSize({width: Math.max(this.el.clientWidth, 300), height: 200}); }
  destroy() { if (this.plot) this.plot.destroy(); this.plot = null; this.el.innerHTML = ""; }
}

// ---- live --------------------------------------------------------------------------------

const DROP = ["queue_full", "expired", "too_large", "slow_consumer", "not_authorized", "topic_limit", "sink_refused"];
const live = {
  points: [], last: 0, timer: null,
  charts: {
    in: new Chart($("#chart-in"), ["QoS 0", "QoS 1", "QoS 2"], {y: "msg/s"}),
    out: new Chart($("#chart-out"), ["QoS 0", "QoS 1", "QoS 2"], {y: "msg/s"}),
    conn: new Chart($("#chart-conn"), ["connections", "sessions"]),
    dropped: new Chart($("#chart-dropped"), DROP, {y: "msg/s"}),
    spool: new Chart($("#chart-spool"), ["spool (messages)"]),
    lag: new Chart($("#chart-lag"), ["Kafka forwarding lag", "history job: since last commit"], {y: "s", spanGaps: true}),
  },
  async tick() {
    try {
      const r = await api("api/live?since=" + live.last);
      banner(null);
      live.points = live.points.concat(r.points).slice(-900);
      if (r.points.length) live.last = r.points[r.points.length - 1].t;
      status(r);
      cards(r.totals, r.sink);
      live.draw(r);
    } catch (e) {
      banner(e.status === 401 ? "Log in again: " + e.message : e.message);
    }
  },
  draw(r) {
    const p = live.points, t = p.map((x) => x.t), col = (f) => p.map(f);
    const c = live.charts;
    c.in.set([t, col((x) => x.in[0]), col((x) => x.in[1]), col((x) => x.in[2])]);
    c.out.set([t, col((x) => x.out[0]), col((x) => x.out[1]), col((x) => x.out[2])]);
    c.conn.set([t, col((x) => x.connections), col((x) => x.sessions)]);
    c.dropped.set([t].concat(DROP.map((k) => col((x) => x.dropped[k]))));
    c.spool.set([t, col((x) => x.spool_messages ?? null)]);
    c.lag.set([t, col((x) => x.kafka_lag_seconds ?? null), col((x) => x.history_lag_seconds ?? null)]);
    $("#live-note").textContent = (r.sink ? "" : "The Kafka sink is off: no spool or lag to show. ") +
      `One point every ${r.sample_seconds} s; updated ${new Date(r.now * 1000).toLocaleTimeString()}.`;
  },
};

function cards(t, sink) {
  const items = [["connections", t.connections], ["sessions", t.sessions], ["subscriptions", t.subscriptions],
    ["retained", t.retained], ["queued", t.queued], ["in flight", t.inflight],
    ["received", t.received_by_qos.reduce((a, b) => a + b, 0)], ["sent", t.sent_by_qos.reduce((a, b) => a + b, 0)],
    ["dropped", Object.values(t.dropped).reduce((a, b) => a + b, 0)]];
  if (sink) items.push(["spool", sink.spool_messages], ["forwarded", sink.forwarded]);
  $("#cards").innerHTML = items.map(([k, v]) =>
    `<div class="card"><div class="v">${esc(fmtNum(v))}</div><div class="k">${esc(k)}</div></div>`).join("");
}

function status(r) {
  const pill = (id, cls, text, title) => { const el = $(id); el.className = "pill " + cls; el.textContent = text; el.title = title || ""; };
  pill("#pill-broker", "ok", "broker up");
  if (!r.sink) pill("#pill-sink", "off", "sink off");
  else pill("#pill-sink", r.sink.kafka_up ? "ok" : "bad", r.sink.kafka_up ? "Kafka up" : "Kafka down", r.sink.bootstrap);
  const h = r.history || {};
  if (h.running === null || h.running === undefined) pill("#pill-job", "off", "history job ?");
  else pill("#pill-job", h.running ? "ok" : "bad", h.running ? "history job up" : "history job down", h.url);
}

function banner(msg) {
  const b = $("#banner");
  b.hidden = !msg;
  b.textContent = msg ? "Cannot update: " + msg : "";
}

// ---- clients -----------------------------------------------------------------------------

const clients = {
  async load() {
    const q = $("#client-search").value.trim();
    const tbody = $("#clients-table tbody");
    try {
      const r = await api("api/clients?q=" + encodeURIComponent(q));
      tbody.innerHTML = r.clients.map((c) => `<tr>
        <td class="mono">${esc(c.client_id)}</td><td>${esc(c.protocol)}</td><td>${esc(c.username ?? "")}</td>
        <td class="mono">${esc(c.address)}</td><td>${esc(fmtTime(c.connected_since))}</td>
        <td class="subs">${c.subscriptions.map((s) => `<code title="QoS ${s.qos}">${esc(s.filter)}</code>`).join("")}${c.subscription_count > c.subscriptions.length ? " …" : ""}</td>
        <td class="num">${c.inflight}</td><td class="num">${c.queued}</td></tr>`).join("") ||
        `<tr><td colspan="8" class="note">${q ? "No connected client id contains “" + esc(q) + "”." : "No clients connected."}</td></tr>`;
      $("#clients-table").dataset.rows = String(r.clients.length);
      $("#clients-summary").textContent = `${r.matched} shown of ${r.connected} connections, ${r.sessions} sessions` +
        (r.matched > r.clients.length ? ` (first ${r.clients.length})` : "");
    } catch (e) {
      tbody.innerHTML = `<tr><td colspan="8" class="error">${esc(e.message)}</td></tr>`;
    }
  },
};

// ---- topics ------------------------------------------------------------------------------

const topics = {
  async load() {
    const filt = $("#topic-filter").value.trim() || "#";
    const err = $("#topics-error");
    try {
      const r = await api("api/topics?filter=" + encodeURIComponent(filt));
      err.hidden = true;
      const open = new Set([...document.querySelectorAll("#topic-tree details[open]")].map((d) => d.dataset.path));
      const first = !$("#topic-tree").dataset.count;
      $("#topic-tree").innerHTML = renderTree(buildTree(r.topics), "", open, first) ||
        `<p class="note">No topic matching ${esc(filt)} has a retained message or recent traffic.</p>`;
      $("#topic-tree").dataset.count = String(r.topics.length);
      $("#topics-summary").textContent = `${r.matched} topics` + (r.matched > r.topics.length ? ` (first ${r.topics.length})` : "") +
        `; rates over the last sample`;
    } catch (e) {
      err.hidden = false;
      err.textContent = e.message;
    }
  },
};

function buildTree(list) {
  const root = {children: new Map()};
  for (const t of list) {
    let node = root;
    for (const level of t.topic.split("/")) {
      if (!node.children.has(level)) node.children.set(level, {children: new Map(), rate: 0});
      node = node.children.get(level);
    }
    node.item = t;
  }
  const sum = (n) => { n.rate = (n.item ? n.item.rate : 0); for (const c of n.children.values()) n.rate += sum(c); return n.rate; };
  sum(root);
  return root;
}

function renderTree(node, path, open, first) {
  let html = "";
  for (const [name, child] of [...node.children.entries()].sort((a, b) => a[0].localeCompare(b[0]))) {
    const p = path ? path + "/" + name : name;
    const label = `<span class="mono">${esc(name === "" ? "(empty)" : name)}</span>` +
      (child.rate ? `<span class="rate">${esc(fmtNum(child.rate))} msg/s</span>` : "") +
      (child.item && child.item.count ? `<span class="count">${esc(fmtNum(child.item.count))} msgs</span>` : "") +
      retainedHtml(child.item);
    if (child.children.size) {
      const isOpen = open.has(p) || (first && p.split("/").length < 3);
      html += `<details data-path="${esc(p)}"${isOpen ? " open" : ""}><summary>${label}</summary>${renderTree(child, p, open, first)}</details>`;
    } else {
      html += `<div class="leaf">${label}</div>`;
    }
  }
  return html;
}

function retainedHtml(item) {
  if (!item || !item.retained) return "";
  const r = item.retained;
  const v = r.text !== undefined ? r.text : "base64:" + r.base64;
  return `<span class="ret mono" title="retained, QoS ${r.qos}, ${r.bytes} bytes">${esc(v)}${r.truncated ? "…" : ""}</span>`;
}

// ---- history -----------------------------------------------------------------------------

const history = {
  counts: null, values: null, busy: false,
  setRange(seconds) {
    const to = new Date(), from = new Date(to - seconds * 1000);
    $("#h-to").value = localInput(to);
    $("#h-from").value = localInput(from);
  },
  async run() {
    if (history.busy) return;
    const box = $("#history"), msg = $("#history-message");
    const filt = $("#h-filter").value.trim();
    const from = $("#h-from").value, to = $("#h-to").value;
    const q = new URLSearchParams({filter: filt});
    if (from) q.set("from", new Date(from).toISOString());
    if (to) q.set("to", new Date(to).toISOString());
    box.dataset.state = "loading";
    msg.className = "note";
    msg.textContent = "Asking the history job…";
    history.busy = true;
    try {
      const r = await api("api/history?" + q);
      history.show(r);
    } catch (e) {
      box.dataset.state = "error";
      msg.className = "error";
      msg.textContent = e.message;
      $("#history-charts").hidden = true;
      $("#latest-table").hidden = $("#latest-title").hidden = true;
    } finally {
      history.busy = false;
    }
  },
  show(r) {
    const box = $("#history"), msg = $("#history-message");
    const range = `${fmtTime(r.from)} – ${fmtTime(r.to)} UTC`;
    if (!r.total) {
      box.dataset.state = "empty";
      msg.className = "note";
      msg.textContent = `No messages on ${r.filter} between ${range}. Try a wider time range or filter.`;
      $("#history-charts").hidden = true;
      $("#latest-table").hidden = $("#latest-title").hidden = true;
      return;
    }
    msg.className = "note";
    msg.textContent = `${r.total.toLocaleString()} messages on ${r.filter}, ${range}; ` +
      `one point per ${r.bucket_seconds} s. Answered by the history job in ${r.seconds} s.`;
    $("#history-charts").hidden = false;
    // message counts: every bucket of the range, zeros included
    const b = r.bucket_seconds, start = Math.floor(r.from / b) * b;
    const byBucket = new Map(r.counts.map(([t, n]) => [t, n]));
    const xs = [], ns = [];
    for (let t = start; t < r.to; t += b) { xs.push(t); ns.push(byBucket.get(t) || 0); }
    $("#counts-caption").textContent = `Messages per ${b} s`;
    if (history.counts) history.counts.destroy();
    history.counts = new Chart($("#chart-counts"), ["messages"], {bars: true});
    history.counts.set([xs, ns]);
    // numeric payloads: one line per topic (the most frequent ones)
    if (history.values) history.values.destroy();
    const el = $("#chart-values");
    if (r.values.length) {
      const times = [...new Set(r.values.flatMap((s) => s.points.map((p) => p[0])))].sort((a, c) => a - c);
      const data = [times].concat(r.values.map((s) => {
        const m = new Map(s.points); return times.map((t) => m.has(t) ? m.get(t) : null);
      }));
      history.values = new Chart(el, r.values.map((s) => s.topic), {points: true, spanGaps: true});
      history.values.set(data);
      $("#values-note").textContent = "";
    } else {
      history.values = null;
      el.dataset.points = "0"; el.dataset.series = "0";
      $("#values-note").textContent = "No numeric payloads among these messages.";
    }
    const tbody = $("#latest-table tbody");
    tbody.innerHTML = r.latest.map((m) => `<tr><td class="mono">${esc(m.accepted_at.replace("T", " ").replace("Z", ""))}</td>
      <td class="mono">${esc(m.topic)}</td><td class="mono">${esc(m.client_id)}</td><td>${m.qos}</td><td>${m.retain ? "yes" : ""}</td>
      <td class="mono">${m.payload_text !== null ? esc(m.payload_text.slice(0, 200)) : "base64:" + esc(m.payload_base64)}</td></tr>`).join("");
    $("#latest-table").dataset.rows = String(r.latest.length);
    $("#latest-table").hidden = $("#latest-title").hidden = false;
    box.dataset.state = "done";
  },
};

function localInput(d) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// ---- tabs and timers ---------------------------------------------------------------------

let current = null, refresher = null;

function route() {
  const [name, query] = (location.hash.slice(1) || "live").split("?");
  const tab = ["live", "clients", "topics", "history"].includes(name) ? name : "live";
  for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== "tab-" + tab;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === tab);
  current = tab;
  clearInterval(refresher);
  if (tab === "live") { Object.values(live.charts).forEach((c) => c.resize()); }
  if (tab === "clients") { clients.load(); refresher = setInterval(clients.load, 2000); }
  if (tab === "topics") { topics.load(); refresher = setInterval(topics.load, 2000); }
  if (tab === "history") {
    // #history?filter=sensors/%23&range=3600 (or from=&to=, ISO times) fills the form and runs
    const p = new URLSearchParams(query || "");
    if (p.get("filter")) $("#h-filter").value = p.get("filter");
    if (p.get("from") || p.get("to")) {
      if (p.get("from")) $("#h-from").value = localInput(new Date(p.get("from")));
      if (p.get("to")) $("#h-to").value = localInput(new Date(p.get("to")));
    } else if (p.get("range")) history.setRange(+p.get("range"));
    else if (!$("#h-from").value) history.setRange(3600);
    if (p.get("filter")) history.run();
  }
}

let searchTimer = null;
$("#client-search").addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(clients.load, 250); });
$("#topic-filter").addEventListener("change", topics.load);
$("#history-form").addEventListener("submit", (e) => { e.preventDefault(); history.run(); });
for (const b of document.querySelectorAll("[data-range]")) b.addEventListener("click", () => history.setRange(+b.dataset.range));
window.addEventListener("hashchange", route);
window.addEventListener("resize", () => {
  Object.values(live.charts).forEach((c) => c.resize());
  if (history.counts) history.counts.resize();
  if (history.values) history.values.resize();
});

route();
live.tick();
setInterval(live.tick, 2000);
