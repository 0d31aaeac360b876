// fedstream live view. Reads the coordinator's JSON API every second and
// redraws. Every value from the API goes into the page through textContent
// or an attribute, never as markup.
'use strict';

const POLL_MS = 1000;
const HISTORY = 90; // samples kept per query for the throughput line
const TOKEN_KEY = 'fedstream.token';
const SVG_NS = 'http://www.w3.org/2000/svg';

// Per query name: recent source throughput samples.
const history = new Map();
// Worker id -> display name, from the last /api/workers answer.
let workerNames = new Map();

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  const resp = await fetch(path, { headers, cache: 'no-store' });
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    body = null;
  }
  if (!resp.ok) {
    throw new APIError(resp.status, (body && body.error) || resp.statusText);
  }
  return body;
}

// el builds an HTML element: el('td', {class: 'num'}, 'text', child...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  for (const c of children) append(e, c);
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  setAttrs(e, attrs);
  for (const c of children) append(e, c);
  return e;
}

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
}

function append(e, c) {
  if (c === undefined || c === null) return;
  e.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
}

function badge(state) {
  return el('span', { class: 'badge state-' + state }, state || '?');
}

// rate formats tuples per second compactly.
function rate(v) {
  if (v === undefined || v === null || Number.isNaN(v)) return '–';
  if (v >= 1e6) return (v / 1e6).toFixed(2) + 'M';
  if (v >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (v >= 100) return Math.round(v).toString();
  return v.toFixed(1);
}

function workerName(id) {
  if (!id) return '(unplaced)';
  return workerNames.get(id) || id;
}

function showNotice(msg) {
  const n = document.getElementById('notice');
  if (!msg) {
    n.hidden = true;
    n.textContent = '';
    return;
  }
  n.hidden = false;
  n.textContent = msg;
}

function describeError(err) {
  if (err instanceof APIError) {
    if (err.status === 401) return 'This org requires a token to read it: paste a reader token above. (' + err.message + ')';
    if (err.status === 403) return 'The token does not allow reading this: ' + err.message;
    return 'The coordinator answered ' + err.status + ': ' + err.message;
  }
  return 'The coordinator cannot be reached: ' + err.message;
}

// ---- org

function renderOrg(org) {
  document.getElementById('org-name').textContent = 'org ' + org.org;
  const bits = ['served by coordinator ' + org.node_id + ' (' + org.state.toLowerCase() + ')'];
  if (org.dev_mode) bits.push('dev mode: no tokens');
  if (org.insecure_plaintext) bits.push('INSECURE PLAINTEXT');
  document.getElementById('served-by').textContent = bits.join(' · ');
  const leader = org.leader_id ? 'leader ' + org.leader_id : 'no leader known';
  document.getElementById('org-summary').textContent =
    leader + ' · ' + org.peers.length + ' coordinators · on ' + org.node_id +
    ': last log index ' + org.last_index + ', applied ' + org.applied_index;
  const rows = org.peers.map((p) =>
    el('tr', { 'data-peer': p.id },
      el('td', null, p.id, p.id === org.node_id ? el('span', { class: 'muted' }, ' (this page)') : null),
      el('td', null, p.addr),
      el('td', null, p.suffrage),
      el('td', null, badge(p.leader ? 'leader' : 'follower'))));
  document.getElementById('peers').replaceChildren(...rows);
}

// ---- workers

function renderWorkers(ws, cpu) {
  workerNames = new Map(ws.workers.map((w) => [w.id, w.name || w.id]));
  const sorted = [...ws.workers].sort((a, b) => (a.name || a.id).localeCompare(b.name || b.id));
  const rows = sorted.map((w) => {
    const counts = {};
    for (const t of w.task_states) counts[t.state] = (counts[t.state] || 0) + 1;
    const states = Object.keys(counts).sort().map((s) => el('span', null, badge(s), ' ' + counts[s] + ' '));
    let load = '–';
    if (w.capacity > 0) {
      const pct = Math.round((w.load || 0) * 100);
      // Set through the CSSOM: the page's policy refuses style attributes.
      const fill = el('span');
      fill.style.width = Math.min(100, pct) + '%';
      load = el('span', { title: w.tasks.length + ' of ' + w.capacity + ' task places (' + ws.tasks_per_core + ' per core)' },
        el('span', { class: 'bar' }, fill), ' ' + pct + '%');
    }
    const labels = Object.entries(w.labels).map(([k, v]) => k + '=' + v).join(' ');
    return el('tr', { 'data-worker': w.id },
      el('td', null, w.name || w.id, w.name && w.name !== w.id ? el('div', { class: 'muted' }, w.id) : null),
      el('td', null, w.addr, labels ? el('div', { class: 'muted' }, labels) : null),
      el('td', null, badge(w.status), w.status_note ? el('div', { class: 'muted' }, w.status_note) : null),
      el('td', { class: 'num' }, w.cores),
      el('td', null, load),
      el('td', { class: 'num', title: 'CPU seconds per second used by its tasks, as they report' },
        cpu.has(w.id) ? cpu.get(w.id).toFixed(2) + ' of ' + w.cores : '–'),
      el('td', { class: 'num' }, w.tasks.length),
      el('td', null, ...states));
  });
  if (rows.length === 0) rows.push(el('tr', null, el('td', { colspan: 8, class: 'muted' }, 'no workers have registered')));
  document.getElementById('worker-rows').replaceChildren(...rows);
}

// ---- queries

// layout places fragments in columns by depth (longest path from a source)
// and returns each node's box.
function layout(graph, tasksByFrag) {
  const W = 210, GAPX = 70, GAPY = 22, HEAD = 40, ROW = 15, FOOT = 20, PAD = 16;
  const depth = new Map();
  const inputs = new Map(graph.nodes.map((n) => [n.name, []]));
  for (const e of graph.edges) if (inputs.has(e.to)) inputs.get(e.to).push(e.from);
  // Nodes come in topological order; a fallback pass covers any that do not.
  for (let pass = 0; pass < 2; pass++) {
    for (const n of graph.nodes) {
      let d = 0;
      for (const up of inputs.get(n.name)) if (depth.has(up)) d = Math.max(d, depth.get(up) + 1);
      depth.set(n.name, d);
    }
  }
  const columns = [];
  for (const n of graph.nodes) {
    const d = depth.get(n.name);
    (columns[d] = columns[d] || []).push(n);
  }
  const heights = new Map();
  for (const n of graph.nodes) {
    heights.set(n.name, HEAD + Math.max(1, (tasksByFrag.get(n.name) || []).length) * ROW + FOOT);
  }
  const colHeight = columns.map((col) => (col || []).reduce((h, n) => h + heights.get(n.name), 0) + GAPY * Math.max(0, (col || []).length - 1));
  const height = Math.max(...colHeight, 60) + 2 * PAD;
  const boxes = new Map();
  columns.forEach((col, d) => {
    let y = PAD + (height - 2 * PAD - colHeight[d]) / 2;
    for (const n of col || []) {
      boxes.set(n.name, { x: PAD + d * (W + GAPX), y, w: W, h: heights.get(n.name) });
      y += heights.get(n.name) + GAPY;
    }
  });
  return { boxes, width: PAD * 2 + columns.length * W + Math.max(0, columns.length - 1) * GAPX, height, HEAD, ROW };
}

function sum(list, f) {
  return list.reduce((s, x) => s + (f(x) || 0), 0);
}

function renderGraph(q, statsByTask) {
  const tasksByFrag = new Map();
  for (const t of q.tasks) {
    if (!tasksByFrag.has(t.fragment)) tasksByFrag.set(t.fragment, []);
    tasksByFrag.get(t.fragment).push(t);
  }
  const L = layout(q.graph, tasksByFrag);
  const root = svg('svg', { class: 'graph', width: L.width, height: L.height, viewBox: '0 0 ' + L.width + ' ' + L.height, role: 'img',
    'aria-label': 'operator graph of query ' + q.name });
  const markerId = 'arrow-' + q.name.replace(/[^A-Za-z0-9_-]/g, '_');
  root.appendChild(svg('defs', null,
    svg('marker', { id: markerId, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M 0 0 L 10 5 L 0 10 z' }))));
  for (const e of q.graph.edges) {
    const a = L.boxes.get(e.from), b = L.boxes.get(e.to);
    if (!a || !b) continue;
    const x1 = a.x + a.w, y1 = a.y + a.h / 2, x2 = b.x - 2, y2 = b.y + b.h / 2, mx = (x1 + x2) / 2;
    root.appendChild(svg('path', { class: 'edge', 'data-edge': e.from + '->' + e.to, d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`, 'marker-end': 'url(#' + markerId + ')' }));
  }
  for (const n of q.graph.nodes) {
    const box = L.boxes.get(n.name);
    const tasks = tasksByFrag.get(n.name) || [];
    const figs = tasks.map((t) => statsByTask.get(t.id)).filter((s) => s);
    const bp = figs.length ? Math.max(...figs.map((s) => s.backpressure_ms_per_s || 0)) : 0;
    const cls = 'frag' + (bp >= 500 ? ' bp-high' : bp >= 50 ? ' bp-some' : '');
    const g = svg('g', { class: cls, 'data-fragment': n.name, transform: `translate(${box.x},${box.y})` });
    g.appendChild(svg('rect', { class: 'box', width: box.w, height: box.h, rx: 6 }));
    g.appendChild(svg('text', { class: 'title', x: 10, y: 17 }, n.name));
    let sub = n.type || n.kind;
    if (n.members.length > 1) sub += ' + ' + n.members.slice(1).join(', ');
    if (n.keyed_by.length) sub += ' · by ' + n.keyed_by.join(',');
    g.appendChild(svg('text', { class: 'sub', x: 10, y: 32 }, sub.length > 36 ? sub.slice(0, 35) + '…' : sub));
    tasks.forEach((t, i) => {
      const y = L.HEAD + i * L.ROW + 10;
      const s = statsByTask.get(t.id);
      const known = ['running', 'stalled', 'lost', 'failed', 'unknown', 'unreachable', 'pending'].includes(t.state) ? t.state : 'other';
      const row = svg('g', { class: 'task', 'data-task': t.id, 'data-state': t.state });
      row.appendChild(svg('circle', { class: 'dot-' + known, cx: 14, cy: y - 4, r: 4 }));
      const label = 'p' + t.partition + ' r' + t.replica + ' ' + workerName(t.worker) + ' ' + t.state;
      row.appendChild(svg('text', { x: 24, y }, label));
      row.appendChild(svg('text', { x: box.w - 10, y, 'text-anchor': 'end', class: 'tps' }, s ? rate(s.out_tps) + '/s' : '–'));
      row.appendChild(svg('title', null, t.id + ' on ' + workerName(t.worker) + ': ' + t.state + (t.reason ? ' (' + t.reason + ')' : '')));
      g.appendChild(row);
    });
    const foot = figs.length
      ? 'in ' + rate(sum(figs, (s) => s.in_tps)) + '/s · out ' + rate(sum(figs, (s) => s.out_tps)) + '/s · bp ' + Math.round(bp) + ' ms/s'
      : 'no figures';
    g.appendChild(svg('text', { class: 'figs', x: 10, y: box.h - 7 }, foot));
    root.appendChild(g);
  }
  return root;
}

function sparkline(samples) {
  const w = 240, h = 36;
  const s = svg('svg', { class: 'spark', viewBox: `0 0 ${w} ${h}`, width: w, height: h, 'aria-label': 'source throughput, last ' + HISTORY + ' s' });
  if (samples.length < 2) return s;
  // From zero, so that the height reads as the rate; spread over the width
  // until HISTORY samples have come.
  const top = Math.max(...samples, 1);
  const step = w / (Math.max(samples.length, 2) - 1);
  const pts = samples.map((v, i) => (i * step).toFixed(1) + ',' + (h - 1 - (v / top) * (h - 4)).toFixed(1));
  s.appendChild(svg('polygon', { class: 'area', points: '0,' + h + ' ' + pts.join(' ') + ' ' + w + ',' + h }));
  s.appendChild(svg('polyline', { points: pts.join(' ') }));
  return s;
}

function taskTable(q, statsByTask) {
  const num = (v, f) => el('td', { class: 'num' }, v === undefined ? '–' : f(v));
  const rows = q.tasks.map((t) => {
    const s = statsByTask.get(t.id);
    return el('tr', { 'data-task-row': t.id },
      el('td', null, t.id, t.generation > 1 ? el('span', { class: 'muted' }, ' g' + t.generation) : null),
      el('td', null, workerName(t.worker), t.moving_from ? el('span', { class: 'muted' }, ' (moving from ' + workerName(t.moving_from) + ')') : null),
      el('td', null, badge(t.state), t.reason ? el('div', { class: 'muted' }, t.reason) : null),
      num(s && s.in_tps, rate), num(s && s.out_tps, rate),
      num(s && s.busy, (v) => Math.round(v * 100) + '%'),
      num(s && s.queue, (v) => String(v)),
      num(s && s.backpressure_ms_per_s, (v) => Math.round(v).toString()));
  });
  return el('details', null, el('summary', null, q.tasks.length + ' tasks'),
    el('table', null,
      el('thead', null, el('tr', null, el('th', null, 'task'), el('th', null, 'worker'), el('th', null, 'state'),
        el('th', { class: 'num' }, 'in/s'), el('th', { class: 'num' }, 'out/s'), el('th', { class: 'num' }, 'busy'),
        el('th', { class: 'num' }, 'queue'), el('th', { class: 'num' }, 'backpressure ms/s'))),
      el('tbody', null, ...rows)));
}

function renderQuery(q, openTables) {
  const statsByTask = new Map(q.stats.tasks.map((s) => [s.task, s]));
  const sourceFrags = new Set(q.graph.nodes.filter((n) => n.kind === 'source').map((n) => n.name));
  let total = null;
  if (q.stats.available) {
    // Every replica of a source emits the same tuples: count one replica's worth.
    const srcTasks = q.tasks.filter((t) => sourceFrags.has(t.fragment));
    total = sum(srcTasks, (t) => (statsByTask.get(t.id) || {}).out_tps) / Math.max(1, q.replicas);
  }
  const h = history.get(q.name) || [];
  if (total !== null) {
    h.push(total);
    while (h.length > HISTORY) h.shift();
  }
  history.set(q.name, h);
  const running = q.tasks.filter((t) => t.state === 'running').length;
  const head = el('div', { class: 'query-head' },
    el('h3', null, q.name), badge(q.status),
    el('span', { class: 'muted' }, running + '/' + q.tasks.length + ' tasks running · replicas ' + q.replicas + (q.max_delay ? ' · max delay ' + q.max_delay : '')),
    el('span', null, el('span', { class: 'tps-total', 'data-query-tps': q.name }, total === null ? 'no figures' : rate(total) + ' tuples/s'),
      el('span', { class: 'muted' }, total === null ? ' (' + q.stats.reason + ')' : ' from sources')),
    sparkline(h));
  const details = taskTable(q, statsByTask);
  details.open = openTables.has(q.name);
  details.addEventListener('toggle', () => {
    if (details.open) openTables.add(q.name); else openTables.delete(q.name);
  });
  const parts = [head];
  if (q.graph.error) parts.push(el('p', { class: 'muted' }, 'graph without edges: ' + q.graph.error));
  parts.push(el('div', { class: 'graph-wrap' }, renderGraph(q, statsByTask)), details);
  return el('div', { class: 'query', 'data-query': q.name }, ...parts);
}

const openTables = new Set();

async function fetchQueries() {
  const list = await api('/api/queries');
  const names = list.queries.filter((q) => q.status !== 'stopped').map((q) => q.name);
  // A query stopped or replaced between the two reads is simply not shown.
  const details = await Promise.all(names.map((n) => api('/api/queries/' + encodeURIComponent(n)).catch((err) => {
    if (err instanceof APIError && err.status === 404) return null;
    throw err;
  })));
  return details.filter((q) => q !== null);
}

function renderQueries(details) {
  document.getElementById('queries-empty').hidden = details.length > 0;
  document.getElementById('query-list').replaceChildren(...details.map((q) => renderQuery(q, openTables)));
  const names = details.map((q) => q.name);
  for (const name of [...history.keys()]) if (!names.includes(name)) history.delete(name);
}

// cpuByWorker sums the CPU seconds per second the queries' tasks report,
// per worker; a worker none of whose tasks reported is absent.
function cpuByWorker(details) {
  const cpu = new Map();
  for (const q of details) {
    const workerOf = new Map(q.tasks.map((t) => [t.id, t.worker]));
    for (const s of q.stats.tasks) {
      const w = s.worker || workerOf.get(s.task);
      if (w) cpu.set(w, (cpu.get(w) || 0) + (s.cpu_seconds_per_s || 0));
    }
  }
  return cpu;
}

async function refresh() {
  try {
    const [org, ws, details] = await Promise.all([api('/api/org'), api('/api/workers'), fetchQueries()]);
    renderOrg(org);
    renderWorkers(ws, cpuByWorker(details));
    renderQueries(details);
    showNotice('');
    document.getElementById('updated').textContent = '· updated ' + new Date().toLocaleTimeString();
  } catch (err) {
    showNotice(describeError(err));
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, POLL_MS);
}

function setupToken() {
  const input = document.getElementById('token-input');
  document.getElementById('token-save').addEventListener('click', () => {
    const v = input.value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
    input.value = '';
    input.placeholder = v ? 'token in use for this tab' : 'reader token (not needed in dev)';
    refresh();
  });
  document.getElementById('token-clear').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    input.value = '';
    input.placeholder = 'reader token (not needed in dev)';
    refresh();
  });
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter') document.getElementById('token-save').click();
  });
  if (token()) input.placeholder = 'token in use for this tab';
}

setupToken();
loop();
