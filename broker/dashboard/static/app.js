// MQTT broker dashboard: plain JavaScript + uPlot (vendored). Everything comes from /api/*.
// Rendering state for tests and scripts: every .chart gets data-points (points plotted) and
// data-series; #history gets data-state = idle | loading | done | empty | error.
"use strict";

const COLORS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmtNum = (v) => v == null ? "–" : (Math.abs(v) >= 1000 ? Math.round(v).toLocaleString() : (+v.toFixed(2)).toString());
// Every time from the API is ISO 8601 UTC; the page shows UTC, 24-hour, labelled.
const secs = (iso) => iso ? Date.parse(iso) / 1000 : null;
const fmtTime = (iso) => iso ? String(iso).replace("T", " ").slice(0, 19) : "–";

const session = {me: null};

function showLogin(message) {
  session.me = null;
  $("#main").hidden = true;
  $("#login").hidden = false;
  $("#who").hidden = $("#logout").hidden = true;
  if (message) { $("#login-message").className = "error"; $("#login-message").textContent = message; }
}

function loggedIn(me) {
  session.me = me;
  document.body.classList.toggle("admin", me.role === "admin");
  $("#login").hidden = true;
  $("#main").hidden = false;
  $("#who").hidden = $("#logout").hidden = false;
  $("#who").textContent = `${me.user} (${me.role})`;
}

async function api(path, method = "GET", body = undefined) {
  let res;
  const headers = {"Accept": "application/json"};
  if (method !== "GET") headers["X-CSRF-Token"] = session.me ? session.me.csrf_token : "";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    res = await fetch(path, {method, headers, cache: "no-store", credentials: "same-origin",
                             body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) {
    throw new Error("the broker does not answer (" + e.message + ")");
  }
  let data = null;
  try { data = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) {
    const err = new Error((data && data.error) || ("HTTP " + res.status));
    err.status = res.status;
    if (res.status === 401 && path !== "api/login" && session.me) showLogin("Your session ended: log in again.");
    throw err;
  }
  return data;
}

// ---- charts ------------------------------------------------------------------------------

// x axis labels in UTC, 24-hour
function utcTicks(u, splits) {
  return splits.map((t) => new Date(t * 1000).toISOString().slice(11, 19));
}

// The x axis font (uPlot's default) and the room one label needs: the widest label ("00:00:00")
// plus a gap. uPlot puts ticks at least `space` CSS pixels apart, so the labels never overlap
// however narrow the chart is (fewer labels on a narrow chart).
const AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
const LABEL_GAP = 12;
// tick steps (s): whole seconds only (the labels show seconds), with 2 s and 20 s between
// uPlot's own steps so that a narrow chart keeps more than one label
const X_INCRS = [1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800,
  21600, 43200, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 91 * 86400, 365 * 86400];
let labelRoom = 0;
function xTickSpace() {
  if (!labelRoom) {
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = AXIS_FONT;
    labelRoom = Math.ceil(ctx.measureText("00:00:00").width) + LABEL_GAP;
  }
  return labelRoom;
}

// counts and rates start at zero; measured values (temperatures...) get a range around the data
const zeroRange = (u, min, max) => [Math.min(0, min ?? 0), Math.max(1, max ?? 1) * 1.1];
function paddedRange(u, min, max) {
  if (min == null || max == null) return [0, 1];
  const pad = (max - min) * 0.1 || Math.abs(max) * 0.1 || 1;
  return [min - pad, max + pad];
}

class Chart {
  // labels: series names; opts.bars: draw bars; opts.y: y axis label; opts.zero: y from 0;
  // opts.x: [from, to] (epoch s) fixed x range, so charts of one question line up
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
      scales: {x: this.opts.x ? {time: true, range: () => this.opts.x} : {time: true},
               y: {range: this.opts.zero ? zeroRange : paddedRange}},
      axes: [{values: utcTicks, font: AXIS_FONT, space: xTickSpace, incrs: X_INCRS}, {size: 60, label: this.opts.y || ""}],
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
  points: [], last: null, timer: null,
  charts: {
    in: new Chart($("#chart-in"), ["QoS 0", "QoS 1", "QoS 2"], {y: "msg/s", zero: true}),
    out: new Chart($("#chart-out"), ["QoS 0", "QoS 1", "QoS 2"], {y: "msg/s", zero: true}),
    conn: new Chart($("#chart-conn"), ["connections", "sessions"], {zero: true}),
    dropped: new Chart($("#chart-dropped"), DROP, {y: "msg/s", zero: true}),
    spool: new Chart($("#chart-spool"), ["spool (messages)"], {zero: true}),
    lag: new Chart($("#chart-lag"), ["Kafka forwarding lag", "history job: since last commit"], {y: "s", spanGaps: true, zero: true}),
  },
  async tick() {
    try {
      const r = await api("api/live" + (live.last ? "?since=" + encodeURIComponent(live.last) : ""));
      banner(null);
      live.points = live.points.concat(r.points).slice(-900);
      if (r.points.length) live.last = r.points[r.points.length - 1].t;
      status(r);
      cards(r.totals, r.sink, r.cluster);
      live.draw(r);
    } catch (e) {
      if (e.status !== 401) banner(e.message);
    }
  },
  draw(r) {
    const p = live.points, t = p.map((x) => secs(x.t)), col = (f) => p.map(f);
    const c = live.charts;
    c.in.set([t, col((x) => x.in[0]), col((x) => x.in[1]), col((x) => x.in[2])]);
    c.out.set([t, col((x) => x.out[0]), col((x) => x.out[1]), col((x) => x.out[2])]);
    c.conn.set([t, col((x) => x.connections), col((x) => x.sessions)]);
    c.dropped.set([t].concat(DROP.map((k) => col((x) => x.dropped[k]))));
    c.spool.set([t, col((x) => x.spool_messages ?? null)]);
    c.lag.set([t, col((x) => x.kafka_lag_seconds ?? null), col((x) => x.history_lag_seconds ?? null)]);
    const note = !r.sink ? "The Kafka sink is off: no spool or lag to show. "
      : r.sink.history_lag_seconds == null ? "The sink does not follow the history job's commits " +
        "(only with [sink] keep_until = \"history\"): no history lag to show. " : "";
    $("#live-note").textContent = note +
      `One point every ${r.sample_seconds} s; updated ${fmtTime(r.now).slice(11)} UTC.`;
  },
};

function cards(t, sink, cluster) {
  const items = [["connections", t.connections], ["sessions", t.sessions], ["subscriptions", t.subscriptions],
    ["retained (without $SYS)", t.retained], ["queued", t.queued], ["in flight", t.inflight],
    ["received", t.received_by_qos.reduce((a, b) => a + b, 0)], ["sent", t.sent_by_qos.reduce((a, b) => a + b, 0)],
    ["dropped", Object.values(t.dropped).reduce((a, b) => a + b, 0)]];
  if (sink) items.push(["spool", sink.spool_messages], ["forwarded", sink.forwarded]);
  if (cluster) {  // a cluster node: the members and the clients connected to each
    for (const [node, n] of Object.entries(cluster.clients_by_node || {}))
      items.push([`clients on ${node}${node === cluster.node ? " (this node)" : ""}`, n]);
  }
  $("#cards").innerHTML = items.map(([k, v]) =>
    `<div class="card"><div class="v">${esc(fmtNum(v))}</div><div class="k">${esc(k)}</div></div>`).join("");
}

function status(r) {
  const pill = (id, cls, text, title) => { const el = $(id); el.className = "pill " + cls; el.textContent = text; el.title = title || ""; };
  pill("#pill-broker", "ok", "broker up");
  if (!r.sink) pill("#pill-sink", "off", "sink off");
  else pill("#pill-sink", r.sink.kafka_up ? "ok" : "bad", r.sink.kafka_up ? "Kafka up" : "Kafka down", r.sink.bootstrap);
  const cl = $("#pill-cluster");
  cl.hidden = !r.cluster;
  if (r.cluster) pill("#pill-cluster", "ok", `cluster: ${r.cluster.members} nodes`,
    `this node: ${r.cluster.node}; members: ${r.cluster.members_list}`);
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
        <td class="num">${c.inflight}</td><td class="num">${c.queued}</td>
        <td class="admin-only"><button type="button" class="small" data-kick="${esc(c.client_id)}">Kick</button>
          <button type="button" class="small danger" data-ban="${esc(c.client_id)}">Ban</button></td></tr>`).join("") ||
        `<tr><td colspan="9" class="note">${q ? "No connected client id contains “" + esc(q) + "”." : "No clients connected."}</td></tr>`;
      $("#clients-table").dataset.rows = String(r.clients.length);
      $("#clients-summary").textContent = `${r.matched} shown of ${r.connected} connections, ${r.sessions} sessions` +
        (r.matched > r.clients.length ? ` (first ${r.clients.length})` : "");
    } catch (e) {
      tbody.innerHTML = `<tr><td colspan="9" class="error">${esc(e.message)}</td></tr>`;
    }
    clients.loadBans();
    clients.loadRules();
  },
  async loadRules() {
    const tbody = $("#rules-table tbody");
    try {
      const r = await api("api/v1/rules");
      tbody.innerHTML = r.rules.map((x) => `<tr data-rule="${esc(x.name)}"><td class="mono">${esc(x.name)}</td>
        <td>${esc(x.source)}</td>
        <td class="mono">${esc([x.publish, x.table ? "table " + x.table : ""].filter(Boolean).join(", "))}</td>
        <td class="rule-state">${esc(x.state)}</td><td class="num">${typeof x.rows_per_second === "number" ? x.rows_per_second.toFixed(2) : ""}</td>
        <td class="num">${x.rows ?? ""}</td><td class="error">${esc(x.last_error ?? "")}</td>
        <td class="admin-only"><button type="button" class="small" data-rule-${x.paused ? "resume" : "pause"}="${esc(x.name)}">${x.paused ? "Resume" : "Pause"}</button>
          ${x.source === "store" ? `<button type="button" class="small danger" data-rule-remove="${esc(x.name)}">Remove</button>` : ""}</td></tr>`).join("") ||
        `<tr><td colspan="8" class="note">No rules.</td></tr>`;
      $("#rules-table").dataset.rows = String(r.rules.length);
      const note = $("#rules-note");
      note.dataset.text = note.dataset.text || note.textContent;
      note.textContent = r.rules.length && r.status_stale
        ? "The history job has not reported on the rules for a while: is it running? (python -m sink.job --config <your broker.toml>)"
        : note.dataset.text;
    } catch (e) {
      tbody.innerHTML = `<tr><td colspan="8" class="error">${esc(e.message)}</td></tr>`;
    }
  },
  async loadBans() {
    const tbody = $("#bans-table tbody");
    try {
      const r = await api("api/v1/bans");
      tbody.innerHTML = r.bans.map((b) => `<tr><td>${esc(b.kind)}</td><td class="mono">${esc(b.value)}</td>
        <td>${b.until ? esc(fmtTime(b.until)) : "until removed"}</td><td>${esc(b.reason)}</td><td>${esc(b.by)}</td>
        <td class="admin-only"><button type="button" class="small" data-unban-kind="${esc(b.kind)}" data-unban-value="${esc(b.value)}">Unban</button></td></tr>`).join("") ||
        `<tr><td colspan="6" class="note">Nobody is banned.</td></tr>`;
      $("#bans-table").dataset.rows = String(r.bans.length);
    } catch (e) {
      tbody.innerHTML = `<tr><td colspan="6" class="error">${esc(e.message)}</td></tr>`;
    }
  },
};

// ---- admin actions (the admin role; each is an audit line in the broker's log) ---------------

function actionMessage(text, error) {
  const m = $("#action-message");
  m.hidden = false;
  m.className = error ? "error" : "note";
  m.textContent = text;
}

async function act(question, fn, done) {
  if (!window.confirm(question)) return;
  try {
    actionMessage(await fn(), false);
  } catch (e) {
    actionMessage(e.message, true);
  }
  done();
}

document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.dataset.kick !== undefined) {
    const id = b.dataset.kick;
    act(`Disconnect client ${id}?`, async () => {
      await api("api/v1/clients/" + encodeURIComponent(id), "DELETE");
      return `Disconnected ${id}.`;
    }, clients.load);
  } else if (b.dataset.ban !== undefined) {
    const id = b.dataset.ban;
    act(`Ban client id ${id}? It is disconnected and refused until unbanned.`, async () => {
      await api("api/v1/bans", "POST", {kind: "clientid", value: id, reason: "banned from the dashboard"});
      return `Banned ${id}.`;
    }, clients.load);
  } else if (b.dataset.unbanKind !== undefined) {
    const kind = b.dataset.unbanKind, value = b.dataset.unbanValue;
    act(`Remove the ban of ${kind} ${value}?`, async () => {
      await api("api/v1/bans?" + new URLSearchParams({kind, value}), "DELETE");
      return `Unbanned ${kind} ${value}.`;
    }, clients.load);
  } else if (b.dataset.rulePause !== undefined || b.dataset.ruleResume !== undefined) {
    const pause = b.dataset.rulePause !== undefined;
    const name = pause ? b.dataset.rulePause : b.dataset.ruleResume;
    act(`${pause ? "Pause" : "Resume"} rule ${name}?`, async () => {
      await api(`api/v1/rules/${encodeURIComponent(name)}/${pause ? "pause" : "resume"}`, "POST", {});
      return `${pause ? "Paused" : "Resumed"} rule ${name}.`;
    }, clients.load);
  } else if (b.dataset.ruleRemove !== undefined) {
    const name = b.dataset.ruleRemove;
    act(`Remove rule ${name}? The job stops it.`, async () => {
      await api("api/v1/rules/" + encodeURIComponent(name), "DELETE");
      return `Removed rule ${name}.`;
    }, clients.load);
  } else if (b.dataset.deleteRetained !== undefined) {
    const topic = b.dataset.deleteRetained;
    act(`Delete the retained message of ${topic}?`, async () => {
      await api("api/v1/retained?" + new URLSearchParams({topic}), "DELETE");
      return `Deleted the retained message of ${topic}.`;
    }, topics.load);
  }
});

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
  return `<span class="ret mono" title="retained, QoS ${r.qos}, ${r.bytes} bytes">${esc(v)}${r.truncated ? "…" : ""}` +
    `<button type="button" class="small danger admin-only" data-delete-retained="${esc(item.topic)}" title="delete the retained message">✕</button></span>`;
}

// ---- history -----------------------------------------------------------------------------

const history = {
  counts: null, values: null, busy: false,
  setRange(seconds) {
    const to = new Date(), from = new Date(to - seconds * 1000);
    $("#h-to").value = utcInput(to);
    $("#h-from").value = utcInput(from);
  },
  async run() {
    if (history.busy) return;
    const box = $("#history"), msg = $("#history-message");
    const filt = $("#h-filter").value.trim();
    const from = $("#h-from").value, to = $("#h-to").value;
    const q = new URLSearchParams({filter: filt});
    if (from) q.set("from", from.trim().replace(" ", "T") + "Z");   // the form's times are UTC
    if (to) q.set("to", to.trim().replace(" ", "T") + "Z");
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
    // both charts share the x range of the question, so their times line up
    const b = r.bucket_seconds, from = secs(r.from), to = secs(r.to), start = Math.floor(from / b) * b;
    const xr = [start, to];
    // message counts: every bucket of the range, zeros included
    const byBucket = new Map(r.counts.map(([t, n]) => [secs(t), n]));
    const xs = [], ns = [];
    for (let t = start; t < to; t += b) { xs.push(t); ns.push(byBucket.get(t) || 0); }
    $("#counts-caption").textContent = `Messages per ${b} s`;
    if (history.counts) history.counts.destroy();
    history.counts = new Chart($("#chart-counts"), ["messages"], {bars: true, zero: true, x: xr});
    history.counts.set([xs, ns]);
    // numeric payloads: one line per topic (the most frequent ones), y around the values
    if (history.values) history.values.destroy();
    const el = $("#chart-values");
    if (r.values.length) {
      const times = [...new Set(r.values.flatMap((s) => s.points.map((p) => secs(p[0]))))].sort((a, c) => a - c);
      const data = [times].concat(r.values.map((s) => {
        const m = new Map(s.points.map((p) => [secs(p[0]), p[1]])); return times.map((t) => m.has(t) ? m.get(t) : null);
      }));
      history.values = new Chart(el, r.values.map((s) => s.topic), {points: true, spanGaps: true, x: xr});
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

// ---- a JSON field: live (api/field, every 2 s) and history (api/field/history, once) --------

const field = {
  chart: null, timer: null, q: null, live: [], hist: [], last: null, liveNote: "", histNote: "",
  async start() {
    clearInterval(field.timer);
    field.q = new URLSearchParams({filter: $("#f-filter").value.trim(), field: $("#f-field").value.trim()});
    field.live = []; field.hist = []; field.last = null; field.liveNote = ""; field.histNote = "Asking the history job…";
    if (field.chart) field.chart.destroy();
    field.chart = new Chart($("#chart-field"), ["live (avg)", "history (avg)", "history (min)", "history (max)"],
      {points: true, spanGaps: true});
    $("#field-caption").textContent = `${field.q.get("field")} on ${field.q.get("filter")}`;
    $("#field").dataset.state = "loading";
    if (!(await field.tick())) return;
    field.timer = setInterval(field.tick, 2000);
    field.history();
  },
  async tick() {
    if ($("#tab-history").hidden) return true;   // another tab: the chart ends when idle
    const msg = $("#field-message");
    try {
      const r = await api("api/field?" + field.q + (field.last ? "&since=" + encodeURIComponent(field.last) : ""));
      field.live = field.live.concat(r.points).slice(-900);
      if (r.points.length) field.last = r.points[r.points.length - 1][0];
      field.liveNote = `Live: one point every ${r.sample_seconds} s; skipped: ${r.skipped_bad_json} not JSON, ` +
        `${r.skipped_too_large} too large, ${r.missing_field} without the field as a number.`;
      msg.className = "note";
      msg.textContent = "";
      $("#field").dataset.state = "done";
      field.draw();
      return true;
    } catch (e) {
      clearInterval(field.timer);
      $("#field").dataset.state = "error";
      msg.className = "error";
      msg.textContent = e.message;
      return false;
    }
  },
  async history() {
    const q = new URLSearchParams(field.q), from = $("#h-from").value, to = $("#h-to").value;
    if (from) q.set("from", from.trim().replace(" ", "T") + "Z");
    if (to) q.set("to", to.trim().replace(" ", "T") + "Z");
    try {
      const r = await api("api/field/history?" + q);
      field.hist = r.points;
      field.histNote = `History: ${r.total.toLocaleString()} values, one point per ${r.bucket_seconds} s, ` +
        `${fmtTime(r.from)} – ${fmtTime(r.to)} UTC.`;
    } catch (e) {
      field.histNote = "History: " + e.message;
    }
    $("#chart-field").dataset.history = String(field.hist.length);
    field.draw();
  },
  draw() {
    const live = new Map(field.live.map((p) => [secs(p[0]), p[1]]));
    const hist = new Map(field.hist.map((p) => [secs(p[0]), p]));
    const t = [...new Set([...live.keys(), ...hist.keys()])].sort((a, b) => a - b);
    const h = (i) => t.map((x) => hist.has(x) ? hist.get(x)[i] : null);
    field.chart.set([t, t.map((x) => live.has(x) ? live.get(x) : null), h(1), h(2), h(3)]);
    $("#chart-field").dataset.live = String(live.size);
    $("#field-note").textContent = field.liveNote + " " + field.histNote;
  },
};

function utcInput(d) {  // "YYYY-MM-DD HH:MM:SS", UTC, 24-hour
  return d.toISOString().slice(0, 19).replace("T", " ");
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
      if (p.get("from")) $("#h-from").value = utcInput(new Date(p.get("from")));
      if (p.get("to")) $("#h-to").value = utcInput(new Date(p.get("to")));
    } else if (p.get("range")) history.setRange(+p.get("range"));
    else if (!$("#h-from").value) history.setRange(3600);
    if (p.get("filter")) history.run();
  }
}

let searchTimer = null;
$("#client-search").addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(clients.load, 250); });
$("#topic-filter").addEventListener("change", topics.load);
$("#history-form").addEventListener("submit", (e) => { e.preventDefault(); history.run(); });
$("#field-form").addEventListener("submit", (e) => { e.preventDefault(); field.start(); });
for (const b of document.querySelectorAll("[data-range]")) b.addEventListener("click", () => history.setRange(+b.dataset.range));
window.addEventListener("hashchange", route);
window.addEventListener("resize", () => {
  Object.values(live.charts).forEach((c) => c.resize());
  if (history.counts) history.counts.resize();
  if (history.values) history.values.resize();
  if (field.chart) field.chart.resize();
});

$("#login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const m = $("#login-message");
  try {
    const me = await api("api/login", "POST", {user: $("#login-user").value, password: $("#login-password").value});
    $("#login-password").value = "";
    start(me);
  } catch (err) {
    m.className = "error";
    m.textContent = err.message;
  }
});
$("#logout").addEventListener("click", async () => {
  try { await api("api/logout", "POST", {}); } catch (e) { /* gone already */ }
  showLogin("Logged out.");
});

let ticker = null;
function start(me) {
  loggedIn(me);
  route();
  live.tick();
  clearInterval(ticker);
  ticker = setInterval(() => { if (session.me) live.tick(); }, 2000);
}

api("api/me").then(start).catch((e) => showLogin(e.status === 401 ? null : e.message));
