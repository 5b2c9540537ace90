// The grid page: polls data.json (served by the same handler) and draws
// every pool with plain DOM and SVG. No library, no network beyond its own
// route, no inline code (the handler's Content-Security-Policy forbids it).
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const PALETTE = ['#3a78b5', '#c7772a', '#3c8f5a', '#8e5ea2', '#b8423a', '#2a9d9b',
  '#7a7f3a', '#d16ba5', '#5a6b7a', '#a0522d', '#4f6fd1', '#6aa84f'];
let pollMS = 2000;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function meter(value, max) {
  const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
  const fill = el('div', { class: 'fill' + (max > 0 && value >= max ? ' full' : '') });
  fill.style.width = pct + '%';
  return el('div', { class: 'meter' }, el('div', { class: 'track' }, fill),
    el('span', { class: 'figure' }, max > 0 ? `${value} / ${max}` : String(value)));
}

function fmtRate(x) {
  return x >= 10 ? x.toFixed(0) : x.toFixed(2);
}

// fmtWait prints a wait in ms: "0", "850ms", "12.5s".
function fmtWait(ms) {
  if (!ms) return '0';
  return ms < 1000 ? ms + 'ms' : (ms / 1000).toFixed(1) + 's';
}

// chart draws time series over [start, now]: lines [{t, v, color, step,
// gone}] and bars {t, v, color}. A step line holds its last value up to
// now, unless the series is gone: then it ends at its last sample.
function chart({ now, start, lines = [], bars = null, yMax = 0, unit = '', width = 600, height = 170 }) {
  const W = width, H = height, L = 34, R = 8, T = 8, B = 18;
  const span = Math.max(1000, now - start);
  let top = yMax;
  for (const s of lines) for (const v of s.v) top = Math.max(top, v);
  if (bars) for (const v of bars.v) top = Math.max(top, v);
  if (top <= 0) top = 1;
  const x = (t) => L + ((t - start) / span) * (W - L - R);
  const y = (v) => H - B - (v / top) * (H - T - B);
  const svg = svgEl('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img' });
  for (const f of [0, 0.5, 1]) {
    const v = top * f;
    svg.append(svgEl('line', { class: 'grid', x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    const label = svgEl('text', { x: L - 4, y: y(v) + 3, 'text-anchor': 'end' });
    label.textContent = (Number.isInteger(v) ? v : v.toFixed(1)) + unit;
    svg.append(label);
  }
  // Time ticks: the first step that gives at most six.
  const steps = [5, 10, 15, 30, 60, 120, 300].map((s) => s * 1000);
  const step = steps.find((s) => span / s <= 6) || 300000;
  for (let ago = 0; ago <= span; ago += step) {
    const label = svgEl('text', { x: x(now - ago), y: H - 4, 'text-anchor': ago === 0 ? 'end' : 'middle' });
    label.textContent = ago === 0 ? 'now' : (ago < 60000 ? `-${ago / 1000}s` : `-${ago / 60000}m`);
    svg.append(label);
  }
  if (bars) {
    const w = Math.max(2, (W - L - R) / Math.max(30, bars.t.length) * 0.8);
    bars.v.forEach((v, i) => {
      if (v > 0) {
        svg.append(svgEl('rect', { class: 'bar', x: x(bars.t[i]) - w / 2, y: y(v), width: w, height: y(0) - y(v), fill: bars.color }));
      }
    });
  }
  for (const s of lines) {
    if (s.t.length === 0) continue;
    // A step line holds each value until the next sample (a counter such
    // as the lifetime).
    const xy = [];
    s.t.forEach((t, i) => {
      if (s.step && i > 0) xy.push([x(t), y(s.v[i - 1])]);
      xy.push([x(t), y(s.v[i])]);
    });
    if (s.step && !s.gone) xy.push([x(now), y(s.v[s.v.length - 1])]);
    const pts = xy.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(' ');
    const attrs = { class: 'series', points: pts, stroke: s.color };
    if (s.dash) attrs['stroke-dasharray'] = '4 3';
    const line = svgEl('polyline', attrs);
    if (s.title) {
      const t = svgEl('title', {});
      t.textContent = s.title;
      line.append(t);
    }
    svg.append(line);
    if (s.gone) {
      const i = s.t.length - 1;
      svg.append(svgEl('circle', { cx: x(s.t[i]), cy: y(s.v[i]), r: 2.5, fill: s.color, class: 'left' }));
    }
  }
  return svg;
}

function legend(items) {
  return el('div', { class: 'legend' }, ...items.map(([name, color]) => {
    const swatch = el('i');
    swatch.style.background = color;
    return el('span', {}, swatch, name);
  }));
}

function sum(a) { return a.reduce((x, y) => x + y, 0); }

function renderPool(p, d) {
  const s = p.series || { t: [] };
  const last = s.t.length - 1;
  // Sessions per second over the last minute of samples.
  let rate = 0;
  if (last > 0) {
    let i = last;
    while (i > 0 && s.t[last] - s.t[i - 1] <= 60000) i--;
    const span = (s.t[last] - s.t[i]) / 1000;
    let n = 0;
    for (let j = i + 1; j <= last; j++) n += s.sessions_per_sec[j] * (s.t[j] - s.t[j - 1]) / 1000;
    rate = span > 0 ? n / span : 0;
  }
  const drains = sum(s.drains || []);
  const cap = p.capacity + (p.uncapped ? ` (+${p.uncapped} uncapped)` : '');
  const figure = (name, value, key) => el('div', { 'data-figure': key }, name + ' ', el('b', {}, value));
  const figures = el('div', { class: 'figures' },
    figure('workers', p.workers.length + (p.workers_hidden || 0), 'workers'),
    figure('available', p.available, 'available'),
    figure('leaving', p.leaving, 'leaving'),
    figure('active', p.active, 'active'),
    figure('capacity', cap, 'capacity'),
    figure('queue depth', p.queue_depth, 'queue_depth'),
    figure('oldest wait', fmtWait(p.oldest_wait_ms), 'oldest_wait'),
    figure('sessions here', p.local_sessions, 'local_sessions'),
    figure('sessions/s (1 min)', fmtRate(rate), 'sessions_per_sec'),
    figure('drains (15 min)', drains, 'drains'),
    figure('max_lifetime', p.max_lifetime || 'none', 'max_lifetime'),
    figure('max_concurrent', p.max_concurrent || 'none', 'max_concurrent'),
  );
  if (p.bad_records) figures.append(el('div', { class: 'error' }, `${p.bad_records} unreadable worker records (see the admin API)`));

  const rows = p.workers.map((w) => el('tr', { 'data-worker': w.id },
    el('td', { class: 'id' }, w.id),
    el('td', { class: 'status status-' + w.status }, w.status + (w.held ? ' (held)' : '') + (w.suspect_until ? ' (suspect)' : '') +
      ((w.launcher || '').startsWith('playwright') && !w.video ? ' (no video)' : '')),
    el('td', { class: 'lifetime' }, meter(w.lifetime, p.max_lifetime)),
    el('td', { class: 'active' }, meter(w.active, w.cap)),
    el('td', { class: 'playwright' }, w.version || ''),
    el('td', { class: 'heartbeat' }, w.heartbeat_age),
  ));
  const table = el('table', { class: 'staircase' },
    el('thead', {}, el('tr', {}, ...['worker', 'status', 'lifetime / max_lifetime', 'active / cap', 'Playwright', 'heartbeat age'].map((h) => el('th', {}, h)))),
    el('tbody', {}, ...rows));
  const hidden = p.workers_hidden ? el('p', { class: 'muted', 'data-hidden-workers': String(p.workers_hidden) }, `${p.workers_hidden} more workers not listed (the admin API lists every one)`) : null;

  const now = d.sampled_at;
  // The charts span what the history holds: up to the window, at least
  // 20 seconds.
  const start = Math.min(now - 20000, Math.max(now - d.window_ms, s.t.length ? s.t[0] : now));
  const colors = {};
  (p.lifetimes || []).forEach((ws, i) => { colors[ws.id] = PALETTE[i % PALETTE.length]; });
  const saw = chart({
    now, start, yMax: p.max_lifetime, width: 1200, height: 220,
    lines: (p.lifetimes || []).map((ws) => ({ t: ws.t, v: ws.lifetime, color: colors[ws.id], gone: ws.gone, title: ws.id, step: true })),
  });
  // The legend names the workers still registered.
  const sawLegend = legend((p.lifetimes || []).filter((ws) => !ws.gone).slice(0, 16).map((ws) => [ws.id, colors[ws.id]]));
  if (p.untracked_workers) sawLegend.append(el('span', {}, `${p.untracked_workers} more workers not charted`));
  const rateChart = chart({
    now, start,
    lines: [{ t: s.t, v: s.sessions_per_sec || [], color: PALETTE[0], title: 'sessions/s' }],
    bars: { t: s.t, v: s.drains || [], color: PALETTE[1] },
  });
  const loadChart = chart({
    now, start,
    lines: [
      { t: s.t, v: s.capacity || [], color: '#9aa3a8', dash: true, title: 'capacity' },
      { t: s.t, v: s.active || [], color: PALETTE[0], title: 'active' },
      { t: s.t, v: s.queue_depth || [], color: PALETTE[4], title: 'queue depth' },
    ],
  });
  const charts = el('div', { class: 'charts' },
    el('div', { class: 'sawtooth' }, el('h3', {}, 'lifetime per worker (a line ends with a dot where its browser left)'), saw, sawLegend),
    el('div', { class: 'rate' }, el('h3', {}, 'sessions/s and drains'), rateChart,
      legend([['sessions/s', PALETTE[0]], ['drains', PALETTE[1]]])),
    el('div', { class: 'load' }, el('h3', {}, 'active, capacity, queue depth'), loadChart,
      legend([['active', PALETTE[0]], ['capacity', '#9aa3a8'], ['queue depth', PALETTE[4]]])));

  return el('section', { class: 'pool', 'data-pool': p.pool }, el('h2', {}, 'pool ', p.pool), figures, table, hidden,
    sessionTable(p, d), charts);
}

function fmtAge(ms) {
  const sec = Math.max(0, Math.round(ms / 1000));
  return sec < 120 ? `${sec}s` : `${Math.floor(sec / 60)}m${String(sec % 60).padStart(2, '0')}s`;
}

// sessionTable lists the pool's live sessions, every instance's.
function sessionTable(p, d) {
  const ss = p.sessions || [];
  const rows = ss.map((s) => el('tr', { 'data-session': s.id },
    el('td', { class: 'id' }, s.id),
    el('td', {}, s.label || ''),
    el('td', { class: 'id' }, s.worker),
    el('td', {}, s.version || ''),
    el('td', {}, s.instance || ''),
    el('td', {}, s.state),
    el('td', {}, fmtAge(s.age_ms)),
    el('td', {}, fmtAge(s.idle_ms)),
  ));
  const more = p.sessions_hidden ? el('p', { class: 'muted', 'data-hidden-sessions': String(p.sessions_hidden) },
    `${p.sessions_hidden} more sessions not listed (the admin API lists every one)`) : null;
  return el('div', { class: 'sessions' }, el('h3', {}, `sessions (${ss.length + (p.sessions_hidden || 0)})`),
    ss.length === 0 ? el('p', { class: 'muted' }, 'no live session') : el('table', { class: 'sessions' },
      el('thead', {}, el('tr', {}, ...['session', 'label', 'worker', 'Playwright', 'instance', 'state', 'age', 'idle'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...rows)), more);
}

function render(d) {
  const status = document.getElementById('status');
  status.className = d.error ? 'error' : 'muted';
  status.dataset.sampledAt = String(d.sampled_at);
  const when = d.sampled_at ? new Date(d.sampled_at).toLocaleTimeString() : 'never';
  const stale = d.error && d.pools_sampled_at ? `; the pools below are as of ${new Date(d.pools_sampled_at).toLocaleTimeString()}` : '';
  status.textContent = `sampled ${when}, every ${d.interval_ms / 1000}s` + (d.error ? ` — ${d.error}${stale}` : '');
  const main = document.getElementById('pools');
  const sections = d.pools.map((p) => renderPool(p, d));
  if (d.untracked_pools) sections.push(el('p', { class: 'muted' }, `${d.untracked_pools} more pools not shown`));
  if (sections.length === 0 && !d.error) sections.push(el('p', { class: 'muted' }, 'no pools yet'));
  main.replaceChildren(...sections);
}

async function refresh() {
  try {
    const r = await fetch('data.json', { cache: 'no-store', credentials: 'same-origin' });
    if (!r.ok) throw new Error(`data.json answered ${r.status}`);
    const d = await r.json();
    if (d.interval_ms >= 500) pollMS = d.interval_ms;
    render(d);
  } catch (e) {
    const status = document.getElementById('status');
    status.className = 'error';
    status.textContent = `could not load the grid's data: ${e.message}`;
  } finally {
    setTimeout(refresh, pollMS);
  }
}

refresh();
