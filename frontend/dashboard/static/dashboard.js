// TinyServe's live dashboard: reads GET /v1/events with fetch() (so it can send the API key
// as a header) and draws the slots x time chart in SVG. No library, no other origin.
"use strict";

const WINDOW_MS = 30000; // what the slot chart shows
const RECENT = 20; // finished requests listed
const RETRY_MS = 2000;
// How often rejections are read from /metrics. A scrape merges every process's metric files:
// every 2 s from two pages cost ~10% of c=8 throughput on 2 cores (docs/benchmarks.md).
const METRICS_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";

const state = {
  hello: null,
  lastAt: null, // engine ms of the latest update
  segments: [], // {slot, id, tenant, phase, start, end}
  open: new Map(), // slot -> its open segment
  waits: new Map(), // request id -> queue wait (ms), from its grant
  queued: [], // {slot, id, start, end}: the wait before a request's first segment
  outcomes: new Map(), // "outcome|reason" -> count, from the feed since the page opened
  rejections: [], // [stage, reason, count] since the node started, from /metrics
  recent: [], // finish events, newest first
  rate: [], // [engine ms, generated tokens] of recent updates
  selected: null,
  policy: null, // the engine's, from its updates
  controller: null,
};

const $ = (id) => document.getElementById(id);

function apiKey() {
  return $("api-key").value.trim();
}

function headers() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function setStatus(text, kind) {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${kind || ""}`;
}

// -- the feed ---------------------------------------------------------------------------------

async function connect() {
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  setStatus("connecting", "");
  try {
    const resp = await fetch("/v1/events", { headers: headers(), signal: controller.signal });
    if (resp.status === 401) {
      setStatus("API key required", "error");
      $("api-key").focus();
      return; // no retry: the user has to give a key
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    setStatus("live", "live");
    await readEvents(resp.body, controller.signal);
    setStatus("stream ended", "");
  } catch (err) {
    if (controller.signal.aborted) return;
    setStatus(`disconnected (${err.message})`, "error");
  }
  if (state.controller === controller) setTimeout(connect, RETRY_MS);
}

async function readEvents(body, signal) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  while (!signal.aborted) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      dispatch(block);
    }
  }
}

function dispatch(block) {
  let event = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (!data) return; // a keep-alive comment
  const body = JSON.parse(data);
  if (event === "hello") onHello(body);
  else if (event === "update") onUpdate(body);
  else if (event === "end") setStatus(`ended: ${body.reason}`, "");
}

function onHello(hello) {
  state.hello = hello;
  state.policy = null;
  $("node").textContent =
    `${hello.model} · ${hello.slots} slots · ${hello.blocks_total} KV blocks of ` +
    `${hello.block_size} tokens`;
  $("window-s").textContent = String(WINDOW_MS / 1000);
}

function onUpdate(u) {
  if (u.policy && state.policy !== u.policy) {
    state.policy = u.policy;
    $("node").textContent += ` · policy ${u.policy}`;
  }
  const start = state.lastAt === null ? u.at_ms - u.window_s * 1000 : state.lastAt;
  state.lastAt = u.at_ms;
  for (const e of u.events) onEvent(e);
  trackSlots(u, start);
  state.rate.push([u.at_ms, u.batch.generated || 0]);
  while (state.rate.length && state.rate[0][0] < u.at_ms - 5000) state.rate.shift();
  showFigures(u);
  draw();
}

function onEvent(e) {
  if (e.kind === "grant") {
    state.waits.set(e.request_id, e.wait_ms);
    count("granted", e.rule);
  } else if (e.kind === "finish") {
    state.recent.unshift(e);
    state.recent.length = Math.min(state.recent.length, RECENT);
    count("finished", e.reason);
  }
  // Rejections (frontend and engine stage) come from /metrics: the feed sees only the engine's.
}

function count(outcome, reason) {
  const key = `${outcome}|${reason}`;
  state.outcomes.set(key, (state.outcomes.get(key) || 0) + 1);
}

// Each slot's state is sampled once per update: a segment grows while the slot holds the same
// request in the same phase, and a new one starts when either changes.
function trackSlots(u, start) {
  u.slots.forEach((s, slot) => {
    const open = state.open.get(slot);
    if (s === null) {
      state.open.delete(slot);
      return;
    }
    if (open && open.id === s.request_id && open.phase === s.phase) {
      open.end = u.at_ms;
      open.info = s;
      return;
    }
    if (!open || open.id !== s.request_id) {
      const wait = state.waits.get(s.request_id);
      if (wait) state.queued.push({ slot, id: s.request_id, start: start - wait, end: start });
    }
    const seg = { slot, id: s.request_id, tenant: s.tenant, phase: s.phase, start, end: u.at_ms, info: s };
    state.segments.push(seg);
    state.open.set(slot, seg);
  });
  const horizon = u.at_ms - WINDOW_MS;
  state.segments = state.segments.filter((seg) => seg.end >= horizon);
  state.queued = state.queued.filter((q) => q.end >= horizon);
}

// -- figures ----------------------------------------------------------------------------------

function showFigures(u) {
  const span = state.rate.length > 1 ? state.rate[state.rate.length - 1][0] - state.rate[0][0] : 0;
  const tokens = state.rate.slice(1).reduce((sum, r) => sum + r[1], 0);
  $("throughput").textContent = span > 0 ? (tokens / (span / 1000)).toFixed(1) : "0";
  if (u.ticks) {
    const b = u.batch;
    const embedS = b.embed_s || 0;
    $("tick-ms").textContent = (((b.decode_s + embedS) * 1000) / u.ticks).toFixed(1);
    $("batch-size").textContent = String(b.requests);
    const share = b.tokens ? b.prefill_tokens / b.tokens : 0;
    $("prefill-share").textContent = `${Math.round(share * 100)}%`;
    const busy = b.decode_s + embedS;
    $("embed-share").textContent = `${Math.round(busy ? (100 * embedS) / busy : 0)}%`;
    $("embed-tokens").textContent = ((b.embed_tokens || 0) / u.ticks).toFixed(1);
    $("embed-rows").textContent = ((b.embed_rows || 0) / u.ticks).toFixed(1);
  }
  const kv = u.kv;
  $("kv-used").textContent = String(kv.used);
  $("kv-cached").textContent = String(kv.cached);
  $("kv-free").textContent = String(kv.free);
  $("kv-total").textContent = String(kv.total);
  $("kv-bar-used").style.width = `${(100 * kv.used) / Math.max(kv.total, 1)}%`;
  $("kv-bar-cached").style.width = `${(100 * kv.cached) / Math.max(kv.total, 1)}%`;
  $("queue-total").textContent = String(u.queue.reduce((sum, q) => sum + q.count, 0));
  fillRows($("queue"), u.queue.map((q) => [q.tenant, q.priority, q.count]));
  const embedQueue = u.embed_queue || [];
  $("embed-queue-total").textContent = String(embedQueue.reduce((sum, q) => sum + q.count, 0));
  fillRows($("embed-queue"), embedQueue.map((q) => [q.tenant, q.priority, q.count]));
  const outcomes = [...state.outcomes].sort((a, b) => b[1] - a[1]);
  fillRows($("outcomes"), [
    ...outcomes.map(([key, n]) => [...key.split("|"), n]),
    ...state.rejections.map(([stage, reason, n]) => [`rejected at ${stage}*`, reason, n]),
  ]);
  const recent = $("recent");
  fillRows(recent, state.recent.map((e) => [
    e.request_id, e.tenant, e.reason, fmt(e.wait_ms), fmt(e.ttft_ms), fmt(e.itl_ms), e.cached_tokens,
  ]));
  [...recent.rows].forEach((row, i) => {
    row.dataset.requestId = state.recent[i].request_id;
  });
}

function fmt(ms) {
  return ms === null || ms === undefined ? "–" : ms.toFixed(1);
}

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = String(cell);
      tr.appendChild(td);
    }
    return tr;
  }));
}

// -- the slot chart ---------------------------------------------------------------------------

// Tenants get colours in the order they first appear: distinct for the first ten.
const PALETTE = ["#3b6fb6", "#d9822b", "#3f9b4f", "#c0392b", "#8e5bb5", "#8c6d46", "#d35fa5",
  "#7f8c8d", "#b5b82f", "#2bb3c0"];
const colours = new Map();

function tenantColour(tenant) {
  if (!colours.has(tenant)) {
    colours.set(tenant, PALETTE[colours.size % PALETTE.length]);
    showLegend();
  }
  return colours.get(tenant);
}

function showLegend() {
  $("legend").replaceChildren(...[...colours].map(([tenant, colour]) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = colour;
    item.append(swatch, tenant);
    return item;
  }));
}

function el(name, attrs) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function draw() {
  const svg = $("slots");
  const slots = state.hello ? state.hello.slots : 0;
  const width = svg.clientWidth || 800;
  const height = svg.clientHeight || 260;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const left = 52;
  const rowH = slots ? (height - 16) / slots : 0;
  const t1 = state.lastAt;
  const x = (t) => left + ((t - (t1 - WINDOW_MS)) / WINDOW_MS) * (width - left - 4);
  const nodes = [];
  for (let slot = 0; slot < slots; slot++) {
    const y = 4 + slot * rowH;
    const row = el("g", { class: "slot-row", "data-slot": slot });
    row.appendChild(el("line", { class: "grid", x1: left, x2: width, y1: y + rowH, y2: y + rowH }));
    const label = el("text", { class: "row-label", x: 4, y: y + rowH / 2 + 4 });
    label.textContent = `slot ${slot}`;
    row.appendChild(label);
    nodes.push(row);
  }
  for (const q of state.queued) {
    const y = 4 + q.slot * rowH + rowH * 0.08; // above the bars, which fill 15-85%
    nodes.push(el("line", { class: "queued", x1: Math.max(x(q.start), left), x2: x(q.end), y1: y, y2: y }));
  }
  for (const seg of state.segments) {
    const x0 = Math.max(x(seg.start), left);
    const bar = el("rect", {
      class: `bar ${seg.phase}${seg.id === state.selected ? " selected" : ""}`,
      "data-request-id": seg.id,
      x: x0,
      y: 4 + seg.slot * rowH + rowH * 0.15,
      width: Math.max(x(seg.end) - x0 - 1, 1.5), // a gap shows where the next request starts
      height: rowH * 0.7,
      fill: tenantColour(seg.tenant),
    });
    const title = el("title", {});
    const i = seg.info;
    title.textContent = `${seg.id} · tenant ${seg.tenant} · ${seg.phase} · ` +
      `${i.n_past}/${i.prompt_tokens} prompt tokens in KV (${i.cached_tokens} cached) · ` +
      `${i.generated} generated`;
    bar.appendChild(title);
    nodes.push(bar);
  }
  svg.replaceChildren(...nodes);
}

// Node-wide rejections by stage and reason (every frontend's and the engine's), since start.
async function pollRejections() {
  try {
    const resp = await fetch("/metrics", { headers: headers() });
    if (resp.ok) state.rejections = parseRejections(await resp.text());
  } catch (err) {
    // the next poll tries again; the feed's status line shows a dead server
  }
  setTimeout(pollRejections, METRICS_MS);
}

function parseRejections(text) {
  const rows = [];
  const pattern = /^tinyserve_admission_rejections_total\{([^}]*)\} (\S+)$/gm;
  for (const m of text.matchAll(pattern)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    const n = Number(m[2]);
    if (n > 0) rows.push([labels.stage, labels.reason, n]);
  }
  return rows;
}

// -- a request's timeline ---------------------------------------------------------------------

async function showRequest(id) {
  state.selected = id;
  $("timeline-id").textContent = id;
  const box = $("timeline");
  box.textContent = "loading…";
  const resp = await fetch(`/v1/requests/${encodeURIComponent(id)}`, { headers: headers() });
  const body = await resp.json();
  if (!resp.ok) {
    box.textContent = `${resp.status}: ${(body.error && body.error.message) || "error"}`;
    return body;
  }
  box.replaceChildren(timelineView(body));
  draw();
  return body;
}

// "slot 120, host 2048, computed 312": where a prompt's tokens came from, the empty tiers left out.
function promptFrom(sources) {
  if (!sources) return "–";
  const parts = Object.entries(sources).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`);
  return parts.join(", ") || "–";
}

function timelineView(t) {
  const q = t.queue || {};
  const fin = t.finish || {};
  const prefill = (t.prefill || []).map((c) => `${c.tokens} tok @ tick ${c.tick}`).join(", ");
  const items = [
    ["status", t.status],
    ["tenant / priority", `${t.tenant} / ${t.priority}`],
    ["waited", q.wait_ms === null || q.wait_ms === undefined ? "–" : `${q.wait_ms.toFixed(1)} ms`],
    ["why it waited", `policy ${q.policy || "–"}, rule ${q.rule || "–"}, ${q.ahead ?? "–"} granted a slot ahead of it`],
    ["slot", t.slot ? `${t.slot.index} at ${t.slot.ms} ms` : "–"],
    ["cache gave it", `${t.prefix_reused_tokens} of ${t.prompt_tokens} prompt tokens`],
    ["prompt from", promptFrom(t.prompt_from)],
    ["prefill chunks", prefill || "–"],
    ["first token", t.first_token_ms === null ? "–" : `${t.first_token_ms} ms`],
    ["finish", fin.reason ? `${fin.reason} at ${fin.ms} ms, ${fin.generated_tokens} tokens` : "–"],
  ];
  const wrap = document.createElement("div");
  wrap.className = "timeline-view";
  const dl = document.createElement("dl");
  for (const [k, v] of items) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  }
  const pre = document.createElement("pre");
  pre.textContent = JSON.stringify(t, null, 2);
  wrap.append(dl, pre);
  return wrap;
}

function onClick(event) {
  const target = event.target.closest("[data-request-id]");
  if (target) showRequest(target.dataset.requestId || target.getAttribute("data-request-id"));
}

function start() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    connect();
  });
  $("slots").addEventListener("click", onClick);
  $("recent").addEventListener("click", onClick);
  connect();
  pollRejections();
}

// For tests and the console: what a click does, and the state drawn from.
window.tinyserveDashboard = { showRequest, state };
document.addEventListener("DOMContentLoaded", start);
