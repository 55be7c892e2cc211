// solocron's web console: plain DOM, no framework, no build step, nothing fetched but the
// JSON API under /api/v1 (with the caller's token as `Authorization: Bearer`).
//
// Rules this file keeps:
// - Job names, reasons and run output are untrusted: they reach the page only as text
//   (textContent, attribute values); no string is ever parsed as markup.
// - The current view is read every POLL_MS, and only while the page is visible: nothing is
//   read from the store while nobody looks.
// - Paging and search happen on the server, so the console holds 10,000 jobs like 10.
// - A status is never told by colour alone: every state has a glyph and a word.
'use strict';

/** How often the current view is read again while visible. */
const POLL_MS = 2000;
/** How often countdowns and "ago" texts are redrawn (no request). */
const CLOCK_MS = 1000;
/** Jobs per page (the API allows 1 to 200). */
const JOBS_PAGE = 50;
/** Runs per history page (the API allows 1 to 500). */
const RUNS_PAGE = 25;
/** Audit records shown (the API allows 1 to 500). */
const ACTIONS_SHOWN = 100;
/** Cells in a job's strip of recent runs (the API sends at most 20). */
const STRIP_CELLS = 20;
/** How long a success message stays. */
const FLASH_MS = 20000;
/** Revisions shown on a job's page (the API allows 1 to 1000; one more is read to tell
 *  the oldest shown as created or changed). */
const REVISIONS_SHOWN = 25;
/** Longest definition (in lines, either side) diffed line by line; a longer one is shown
 *  as wholly removed and added (the diff's table grows with the product of both). */
const DIFF_LINES_MAX = 1000;
/** Rows of the definition editor: its text's lines and one more, within these bounds. */
const EDITOR_ROWS_MIN = 10;
const EDITOR_ROWS_MAX = 28;
/** What a new job's definition starts as: an HTTP job, the API's kind. */
const NEW_JOB_TEMPLATE = {
  schedule: '*/15 * * * *',
  timezone: 'UTC',
  http: { url: 'https://service.internal/jobs/refresh', method: 'POST', timeout: '30s' },
  lease: '60s',
};
/** Where the token is kept: for this tab only, gone when it closes. */
const TOKEN_KEY = 'solocron.token';
/** Set when the caller chose to go on without a token (a server with none). */
const ANON_KEY = 'solocron.anonymous';
const API = '/api/v1';

/** Each run state's glyph and words: the glyph is what makes it readable without colour. */
const RUN_STATES = {
  running: ['▶', 'running'],
  succeeded: ['✓', 'succeeded'],
  failed: ['✕', 'failed'],
  timed_out: ['T', 'timed out'],
  lost: ['L', 'lost'],
  abandoned: ['A', 'abandoned'],
  interrupted: ['I', 'interrupted'],
  skipped: ['–', 'skipped'],
  waiting: ['↻', 'retry waiting'],
};
const LIVENESS = { alive: '●', stale: '◐', gone: '○' };
const JOB_FILTERS = [['', 'All jobs'], ['active', 'Active'], ['paused', 'Paused'], ['running', 'Running'],
  ['stale', 'Stale'], ['drift', 'Drift']];

/** What each action does, said in its confirmation dialog. */
const ACTIONS = {
  trigger: {
    verb: 'Trigger', reason: false,
    text: 'A node serving the job runs it once now, whatever its schedule (paused or not).',
  },
  pause: {
    verb: 'Pause', reason: false,
    text: 'Every node records the job\'s ticks as skipped, naming you, until it is resumed. A run in progress goes on; manual triggers still run.',
  },
  resume: {
    verb: 'Resume', reason: false,
    text: 'The job runs again from its next tick. Ticks skipped while it was paused stay skipped.',
  },
  unlock: {
    verb: 'Unlock', reason: true, danger: true,
    text: 'Its running runs are ended as abandoned; their holders stop the job at their next lease renewal. For a run that is stuck or whose node is gone.',
  },
  // The API takes no reason for a delete: the revision records who deleted the job.
  delete: {
    verb: 'Delete', reason: false, danger: true, noReason: true,
    text: 'Its definition is removed from the store: every node stops scheduling it within a second, and a run in progress finishes. Its runs and revisions stay.',
  },
};

/** How a revision changed its job, as a glyph and a word. */
const CHANGES = { created: ['+', 'created'], changed: ['~', 'changed'], deleted: ['−', 'deleted'] };

const S = {
  token: sessionStorage.getItem(TOKEN_KEY),
  me: null, // whoami, once signed in
  view: null, // the current view
  nav: 0, // bumped on every navigation: answers for an older view are dropped
  seq: 0, // bumped on every read: only the newest read draws
  timer: 0,
  abort: new AbortController(),
  flashTimer: 0,
};

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------
// DOM helpers: every piece of data goes in as a text node or an attribute value.

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces a region's content, keeping keyboard focus on the element with the same key. */
function swap(region, ...nodes) {
  const active = document.activeElement;
  const key = active && region.contains(active) ? active.getAttribute('data-key') : null;
  region.replaceChildren(...nodes.flat(Infinity).filter(Boolean));
  if (key) {
    const again = region.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus({ preventScroll: true });
  }
}

const enc = encodeURIComponent;
const jobHref = (name) => `#/jobs/${enc(name)}`;
const runHref = (id) => `#/runs/${enc(id)}`;

// ---------------------------------------------------------------------------------------
// Formatting. Instants are shown in UTC unless the job's zone is what matters (fire times).

const pad = (n, w = 2) => String(n).padStart(w, '0');

function utc(iso, ms = false) {
  if (!iso) return '—';
  const d = new Date(iso);
  const s = `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  return (ms ? `${s}.${pad(d.getUTCMilliseconds(), 3)}` : s) + ' UTC';
}

/** Today's instants as a time only, older ones with their date (UTC). */
function utcShort(iso) {
  if (!iso) return '—';
  const full = utc(iso);
  return full.slice(0, 10) === utc(new Date().toISOString()).slice(0, 10) ? full.slice(11, 19) : full.slice(0, 16);
}

const zoneFormats = new Map();
function zoneFormat(zone) {
  let f = zoneFormats.get(zone);
  if (!f) {
    const opts = { weekday: 'short', year: 'numeric', day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit',
      second: '2-digit', hourCycle: 'h23', timeZoneName: 'short' };
    try {
      f = new Intl.DateTimeFormat('en-GB', { ...opts, timeZone: zone || 'UTC' });
    } catch {
      f = new Intl.DateTimeFormat('en-GB', { ...opts, timeZone: 'UTC' });
    }
    zoneFormats.set(zone, f);
  }
  return f;
}

/** An instant as the clock on the wall of its zone reads it: the time alone when it is today
 *  there, else with the day (and the year when it is another). */
function inZone(iso, zone) {
  if (!iso) return '—';
  const f = zoneFormat(zone);
  const parts = (d) => Object.fromEntries(f.formatToParts(d).map((p) => [p.type, p.value]));
  const t = parts(new Date(iso));
  const now = parts(new Date());
  const today = t.year === now.year && t.month === now.month && t.day === now.day;
  if (today) return `${t.hour}:${t.minute}:${t.second} ${t.timeZoneName}`;
  const time = t.second === '00' ? `${t.hour}:${t.minute}` : `${t.hour}:${t.minute}:${t.second}`;
  return `${t.weekday} ${t.day} ${t.month}${t.year === now.year ? '' : ` ${t.year}`} ${time} ${t.timeZoneName}`;
}

/** A duration, as precise as its size deserves. */
function span(ms) {
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(a)} ms`;
  if (a < 10000) return `${(a / 1000).toFixed(1)} s`;
  return coarse(Math.floor(a / 1000));
}

/** Whole seconds, in the two largest units. */
function coarse(s) {
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs} h ${m % 60} min`;
  return `${Math.floor(hrs / 24)} d ${hrs % 24} h`;
}

function countdown(iso, now = Date.now()) {
  const d = Date.parse(iso) - now;
  return d <= 0 ? 'due now' : `in ${coarse(Math.ceil(d / 1000))}`;
}

function ago(iso, now = Date.now()) {
  const d = now - Date.parse(iso);
  return d < 1000 ? 'just now' : `${coarse(Math.floor(d / 1000))} ago`;
}

const ms = (v) => (v === null || v === undefined ? '—' : span(v));
const dash = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));

/** A live countdown to `iso` (redrawn every CLOCK_MS), with the exact instant as its title. */
function countdownEl(iso, title) {
  return h('time', { datetime: iso, 'data-countdown': iso, title: title || utc(iso) }, countdown(iso));
}
function agoEl(iso) {
  return h('time', { datetime: iso, 'data-ago': iso, title: utc(iso, true) }, ago(iso));
}

function runState(state) {
  return RUN_STATES[state] || ['?', state];
}

/** A state as a chip: glyph and word, coloured. */
function chip(state, extra) {
  const [glyph, words] = runState(state);
  return h('span', { class: `chip st-${state in RUN_STATES ? state : 'unknown'}`, 'data-state': state },
    h('span', { class: 'glyph', 'aria-hidden': 'true' }, glyph), words, extra);
}

function problemText(e) {
  if (!e) return 'something went wrong';
  if (e.problem) {
    const p = e.problem;
    return p.detail || p.title || `HTTP ${e.status}`;
  }
  return e.message || String(e);
}

// ---------------------------------------------------------------------------------------
// The API.

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

/** A call of the API; `ifMatch` (a revision) or `ifNoneMatch` makes a managed job's write
 *  conditional. */
async function api(path, { method = 'GET', body, token = S.token, signal, ifMatch, ifNoneMatch } = {}) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (ifMatch !== undefined) headers['If-Match'] = `"${ifMatch}"`;
  if (ifNoneMatch) headers['If-None-Match'] = '*';
  let res;
  try {
    res = await fetch(API + path, {
      method, headers, signal, cache: 'no-store', credentials: 'omit',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, { title: 'Unreachable', detail: 'the server did not answer; is it running?' });
  }
  const type = res.headers.get('content-type') || '';
  const data = type.includes('json') ? await res.json().catch(() => null) : null;
  if (!res.ok) throw new ApiError(res.status, data || { title: res.statusText, detail: `HTTP ${res.status}` });
  return data;
}

function qs(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
}

// ---------------------------------------------------------------------------------------
// Signing in.

async function start(message) {
  const anonymous = sessionStorage.getItem(ANON_KEY) === '1';
  if (S.token || anonymous) {
    try {
      return enter(await api('/whoami'));
    } catch (e) {
      if (e.status === 401) {
        message = S.token ? `The kept token was refused: ${problemText(e)}` : problemText(e);
        forget();
      } else {
        message = `Cannot reach the API: ${problemText(e)}`;
      }
    }
  }
  showSignIn(message);
}

function forget() {
  S.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(ANON_KEY);
}

async function showSignIn(message) {
  S.me = null;
  S.view = null;
  stopPolling();
  $('nav').hidden = true;
  $('who').hidden = true;
  $('live').hidden = true;
  document.body.classList.remove('can-act');
  document.title = 'Sign in · solocron';
  const input = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', required: true,
    spellcheck: 'false', 'aria-describedby': 'signin-help' });
  const error = h('p', { class: 'problem', id: 'signin-error', role: 'alert', hidden: !message }, message || '');
  const anon = h('div', { class: 'anon', hidden: true });
  const form = h('form', { class: 'card signin', id: 'signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in to solocron'),
    h('p', { id: 'signin-help', class: 'muted' },
      'Paste an API token from the [[http.tokens]] of the configuration. It is kept for this tab only and sent to this server alone.'),
    h('label', { for: 'token' }, 'Token'), input, error,
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Sign in')),
    anon);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    error.hidden = true;
    try {
      const me = await api('/whoami', { token });
      S.token = token;
      sessionStorage.setItem(TOKEN_KEY, token);
      enter(me);
    } catch (e) {
      error.textContent = `Not signed in: ${problemText(e)}`;
      error.hidden = false;
      input.select();
    }
  });
  $('main').replaceChildren(form);
  input.focus();
  offerAnonymous(anon);
}

/** A server without tokens lets anyone on this machine read: offer to go on without one. */
async function offerAnonymous(box) {
  try {
    const me = await api('/whoami', { token: null });
    const go = h('button', { type: 'button', id: 'anonymous' }, 'Continue without a token');
    go.addEventListener('click', () => {
      sessionStorage.setItem(ANON_KEY, '1');
      enter(me);
    });
    append(box, [h('p', { class: 'muted' },
      'This server has no tokens configured: it listens on loopback only, anyone here may read, and nobody may act.'), go]);
    box.hidden = false;
  } catch {
    // The server wants a token: nothing to offer.
  }
}

function enter(me) {
  S.me = me;
  $('nav').hidden = false;
  $('who').hidden = false;
  $('live').hidden = false;
  $('who-name').textContent = me.name;
  $('who-role').textContent = me.role ? me.role : 'read only';
  $('who-role').title = me.can_act ? 'May read and act (trigger, pause, resume, unlock; create, edit and delete managed jobs)' : 'May read only';
  document.body.classList.toggle('can-act', !!me.can_act);
  route();
}

function signOut(message) {
  forget();
  showSignIn(message);
}

// ---------------------------------------------------------------------------------------
// Routing (#/jobs, #/jobs/NAME, #/jobs/NAME/edit, #/new-job, #/runs, #/runs/ID, #/nodes,
// #/actions) and polling.

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const at = raw.indexOf('?');
  const path = at < 0 ? raw : raw.slice(0, at);
  const params = new URLSearchParams(at < 0 ? '' : raw.slice(at + 1));
  try {
    return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), params };
  } catch {
    return { parts: ['not-found'], params };
  }
}

function pick(parts, params) {
  const [top, arg] = parts;
  if (!top || (top === 'jobs' && parts.length === 1)) return jobsView(params);
  if (top === 'jobs' && parts.length === 2) return jobView(arg, params);
  if (top === 'jobs' && parts.length === 3 && parts[2] === 'edit') return editorView(arg);
  if (top === 'new-job' && parts.length === 1) return editorView(null);
  if (top === 'runs' && parts.length === 1) return runsView(params);
  if (top === 'runs' && parts.length === 2) return runView(arg);
  if (top === 'nodes' && parts.length === 1) return nodesView();
  if (top === 'actions' && parts.length === 1) return actionsView(params);
  return notFoundView();
}

function route() {
  if (!S.me) return;
  S.nav += 1;
  S.abort.abort();
  S.abort = new AbortController();
  stopPolling();
  const { parts, params } = parseHash();
  const view = pick(parts, params);
  S.view = view;
  $('main').replaceChildren(view.el);
  document.title = `${view.title} · solocron`;
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.view === view.section) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  window.scrollTo(0, 0);
  refresh();
}

/** Reads the current view now, draws it, and reads again POLL_MS later while visible. A view
 *  marked `once` (an editor) is drawn once only: a read must not wipe what is being typed. */
async function refresh() {
  stopPolling();
  const view = S.view;
  if (!view || document.visibilityState !== 'visible' || view.drawn) return;
  const seq = ++S.seq;
  const nav = S.nav;
  try {
    const data = await view.load(S.abort.signal);
    if (seq !== S.seq || nav !== S.nav) return;
    view.render(data);
    if (view.once) view.drawn = true;
    setLive(true);
  } catch (e) {
    if (seq !== S.seq || nav !== S.nav || e.name === 'AbortError') return;
    if (e.status === 401) return signOut(`Signed out: ${problemText(e)}`);
    if (view.failed) view.failed(e);
    setLive(false, problemText(e));
  }
  if (seq === S.seq && document.visibilityState === 'visible' && !view.drawn) S.timer = setTimeout(refresh, POLL_MS);
}

function stopPolling() {
  clearTimeout(S.timer);
  S.timer = 0;
}

function setLive(ok, detail) {
  const el = $('live');
  el.className = ok ? 'live ok' : 'live bad';
  el.textContent = ok ? `Live · ${utcShort(new Date().toISOString())}` : '⚠ Not refreshed';
  el.title = ok ? `Read every ${POLL_MS / 1000} s while this page is visible` : detail;
}

function onVisibility() {
  if (!S.me) return;
  if (document.visibilityState === 'visible') {
    refresh();
  } else {
    stopPolling();
    const el = $('live');
    el.className = 'live idle';
    el.textContent = 'Paused while hidden';
  }
}

function tickClocks() {
  if (document.visibilityState !== 'visible') return;
  const now = Date.now();
  for (const el of document.querySelectorAll('[data-countdown]')) el.textContent = countdown(el.dataset.countdown, now);
  for (const el of document.querySelectorAll('[data-ago]')) el.textContent = ago(el.dataset.ago, now);
}

/** Sets the hash without adding a history entry (filters and search). */
function replaceHash(hash) {
  if (location.hash !== hash) history.replaceState(null, '', hash);
}

// ---------------------------------------------------------------------------------------
// Pieces shared by views.

function section(title, ...children) {
  return h('section', { class: 'panel' }, h('h2', null, title), children);
}

function table(headers, rows, empty, cls) {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'scroll' }, h('table', { class: `grid ${cls || ''}` },
    h('thead', null, h('tr', null, headers.map((x) => h('th', { scope: 'col' }, x)))),
    h('tbody', null, rows)));
}

/** The last runs of a job, oldest left, newest right; one tab stop, arrows move within. */
function strip(recent, jobName, big) {
  const cells = recent.slice(0, STRIP_CELLS).reverse();
  const el = h('div', { class: `strip${big ? ' big' : ''}`, role: 'group',
    'aria-label': `Last ${cells.length} runs of ${jobName}, oldest first` });
  for (let i = cells.length; i < STRIP_CELLS; i++) el.append(h('span', { class: 'cell blank', 'aria-hidden': 'true' }));
  cells.forEach((r, i) => {
    const [glyph, words] = runState(r.state);
    const label = `${words} · ${utc(r.scheduled_at, true)} · ${r.id}`;
    el.append(h('a', { class: `cell st-${r.state in RUN_STATES ? r.state : 'unknown'}`, href: runHref(r.id),
      title: label, 'aria-label': label, 'data-key': `cell:${r.id}`, 'data-run-id': r.id, 'data-state': r.state,
      tabindex: i === cells.length - 1 ? '0' : '-1' }, glyph));
  });
  if (!cells.length) el.append(h('span', { class: 'sr-only' }, 'no runs yet'));
  el.addEventListener('keydown', stripKeys);
  return el;
}

function stripKeys(ev) {
  const cells = [...ev.currentTarget.querySelectorAll('a.cell')];
  const at = cells.indexOf(document.activeElement);
  if (at < 0) return;
  const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: cells.length - 1 }[ev.key];
  if (to === undefined || to < 0 || to >= cells.length) return;
  ev.preventDefault();
  cells[at].tabIndex = -1;
  cells[to].tabIndex = 0;
  cells[to].focus();
}

function badges(job) {
  const out = [];
  if (job.paused) {
    const p = job.paused;
    out.push(h('span', { class: 'badge paused', 'data-badge': 'paused', title: `Paused ${utc(p.at)}` },
      h('span', { 'aria-hidden': 'true' }, '❚❚ '), `Paused by ${p.by}`, p.reason ? `: ${p.reason}` : ''));
  }
  if (job.drift) {
    out.push(h('span', { class: 'badge drift', 'data-badge': 'drift',
      title: 'Live nodes define this job differently; see its policies per node' }, '⚠ Drift'));
  }
  if (job.stale) {
    out.push(h('span', { class: 'badge stale', 'data-badge': 'stale',
      title: 'Nodes registered this job, but none of them is alive' }, '◐ Stale'));
  }
  if (job.managed) {
    const m = job.managed;
    out.push(h('span', { class: 'badge managed', 'data-badge': 'managed',
      title: `Defined in the store: revision ${m.revision}, written by ${m.changed_by} ${utc(m.changed_at)}` },
    h('span', { 'aria-hidden': 'true' }, '✎ '), `Managed · rev ${m.revision}`));
  }
  return out;
}

/** The runs in progress: holder, fencing token, lease left. */
function runningLines(job) {
  return job.running.map((r) => h('div', { class: 'running-line', 'data-running': r.id },
    h('a', { href: runHref(r.id), 'data-key': `running:${r.id}`, class: 'chip st-running' },
      h('span', { class: 'glyph', 'aria-hidden': 'true' }, '▶'), 'running'),
    ' on ', h('strong', null, r.node), ` · token ${dash(r.fencing_token)}`,
    r.lease_until ? [' · lease ', countdownEl(r.lease_until, `Lease until ${utc(r.lease_until, true)} (store clock)`)] : ''));
}

function lastRunLine(job) {
  const r = job.last_run;
  if (!r) return h('span', { class: 'muted' }, 'never ran');
  return h('span', null, h('a', { href: runHref(r.id), 'data-key': `last:${job.name}` }, chip(r.state)), ' ', agoEl(r.finished_at || r.scheduled_at));
}

/** Action buttons for a job; none at all for a caller who may not act. On the job's own
 *  page (`withEdit`) a managed job also has Edit and Delete. */
function actionButtons(job, withEdit) {
  if (!S.me || !S.me.can_act) return null;
  const b = (kind, cls) => h('button', { type: 'button', class: cls || '', 'data-action': kind, 'data-job': job.name,
    'data-key': `act:${kind}:${job.name}`, 'aria-label': `${ACTIONS[kind].verb} ${job.name}`,
    onclick: () => confirmAction(kind, job.name) }, ACTIONS[kind].verb);
  const m = withEdit && job.managed;
  return h('div', { class: 'actions' },
    b('trigger'),
    job.paused ? b('resume') : b('pause'),
    job.running.length ? b('unlock', 'danger') : null,
    m ? h('button', { type: 'button', 'data-action': 'edit', 'data-job': job.name, 'data-key': `act:edit:${job.name}`,
      'aria-label': `Edit ${job.name}`, onclick: () => { location.hash = `${jobHref(job.name)}/edit`; } }, 'Edit') : null,
    m ? h('button', { type: 'button', class: 'danger', 'data-action': 'delete', 'data-job': job.name,
      'data-key': `act:delete:${job.name}`, 'aria-label': `Delete ${job.name}`,
      onclick: () => confirmAction('delete', job.name, m.revision) }, 'Delete') : null);
}

function runsTable(runs, withJob) {
  const rows = runs.map((r) => h('tr', { 'data-run-id': r.id },
    withJob ? h('td', null, h('a', { href: jobHref(r.job) }, r.job)) : null,
    h('td', null, h('a', { href: runHref(r.id), 'data-key': `hist:${r.id}`, title: r.id }, utcShort(r.scheduled_at))),
    h('td', null, chip(r.state)),
    h('td', null, r.trigger),
    h('td', { class: 'num' }, r.attempt),
    h('td', null, r.node),
    h('td', { class: 'num' }, dash(r.fencing_token)),
    h('td', { class: 'num' }, r.lateness_ms === null ? '—' : `+${ms(r.lateness_ms)}`),
    h('td', { class: 'num' }, r.state === 'running' && r.started_at ? agoEl(r.started_at) : ms(r.duration_ms)),
    h('td', { class: 'num' }, dash(r.exit_code)),
    h('td', { class: 'reason' }, dash(r.reason))));
  const heads = ['Scheduled (UTC)', 'State', 'Trigger', 'Try', 'Node', 'Token', 'Late', 'Took', 'Exit', 'Reason'];
  return table(withJob ? ['Job', ...heads] : heads, rows, 'No runs match.', 'runs');
}

function actionsTable(actions, withJob) {
  const rows = actions.map((a) => h('tr', null,
    h('td', null, h('time', { datetime: a.at, title: utc(a.at, true) }, utcShort(a.at))),
    withJob ? h('td', null, h('a', { href: jobHref(a.job) }, a.job)) : null,
    h('td', null, h('span', { class: `kind k-${a.kind}` }, a.kind)),
    h('td', null, a.by),
    h('td', { class: 'reason' }, dash(a.reason)),
    h('td', { class: 'detail' }, a.kind === 'trigger' && a.detail.includes('#')
      ? h('a', { href: runHref(a.detail) }, a.detail) : a.detail)));
  const heads = ['When (UTC)', 'Action', 'By', 'Reason', 'What it did'];
  if (withJob) heads.splice(1, 0, 'Job');
  return table(heads, rows, 'No actions recorded.', 'audit');
}

/** Previous/next over cursor pages; `cursors` holds the cursors of the pages before. */
function pager(pg, label, info, onMove) {
  const prev = h('button', { type: 'button', 'data-key': `${label}:prev`, disabled: !pg.stack.length,
    onclick: () => { pg.cursor = pg.stack.pop() ?? null; onMove(); } }, `← ${pg.prevWord}`);
  const next = h('button', { type: 'button', 'data-key': `${label}:next`, disabled: !pg.next,
    onclick: () => { pg.stack.push(pg.cursor); pg.cursor = pg.next; onMove(); } }, `${pg.nextWord} →`);
  return h('nav', { class: 'pager', 'aria-label': label }, prev, h('span', { class: 'muted' }, info), next);
}

function newPager(prevWord, nextWord) {
  return { cursor: null, stack: [], next: null, prevWord, nextWord };
}

function select(id, label, options, value, onChange) {
  const s = h('select', { id, 'aria-label': label },
    options.map(([v, text]) => h('option', { value: v, selected: v === value }, text)));
  s.addEventListener('change', () => onChange(s.value));
  return s;
}

const RUN_FILTERS = [['', 'All states'], ...Object.entries(RUN_STATES).map(([k, [g, w]]) => [k, `${g} ${w}`])];

function errorBox(e) {
  return h('p', { class: 'problem', role: 'alert' }, problemText(e));
}

// ---------------------------------------------------------------------------------------
// Jobs.

function jobsView(params) {
  const st = { search: params.get('search') || '', state: params.get('state') || '', namespace: params.get('namespace') || '',
    pg: newPager('Previous', 'Next') };
  const body = h('div', { class: 'sheet' });
  // The namespace filter appears once there is a choice; rebuilt only when the list changes
  // (live refreshes must not take the focus away from it).
  const nsBox = h('span', { class: 'ns-box' });
  let nsShown = null;
  const count = h('span', { class: 'count muted', id: 'jobs-count' });
  const search = h('input', { type: 'search', id: 'job-search', placeholder: 'Search jobs by name', value: st.search,
    autocomplete: 'off', spellcheck: 'false', 'aria-keyshortcuts': '/' });
  const pagerBox = h('div', { class: 'pager-box' });
  const changed = () => {
    st.pg = newPager('Previous', 'Next');
    replaceHash(`#/jobs${qs({ search: st.search, state: st.state, namespace: st.namespace })}`);
    body.classList.add('loading');
    refresh();
  };
  let debounce = 0;
  search.addEventListener('input', () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { st.search = search.value.trim(); changed(); }, 250);
  });
  const create = S.me.can_act ? h('div', { class: 'actions' }, h('button', { type: 'button', class: 'primary', id: 'new-job',
    'data-action': 'new', onclick: () => { location.hash = '#/new-job'; } }, h('span', { 'aria-hidden': 'true' }, '+ '), 'New job')) : null;
  const el = h('div', { class: 'view jobs' },
    h('div', { class: 'head' }, h('h1', null, 'Jobs'), count, create),
    h('form', { class: 'toolbar', role: 'search', onsubmit: (e) => { e.preventDefault(); st.search = search.value.trim(); changed(); } },
      h('label', { for: 'job-search', class: 'sr-only' }, 'Search jobs by name'), search,
      select('job-state', 'Show jobs in state', JOB_FILTERS, st.state, (v) => { st.state = v; changed(); }),
      nsBox, legend()),
    body, pagerBox);
  return {
    el, section: 'jobs', title: 'Jobs',
    load: (signal) => api(`/jobs${qs({ search: st.search, state: st.state, namespace: st.namespace, cursor: st.pg.cursor, limit: JOBS_PAGE })}`, { signal }),
    render(page) {
      body.classList.remove('loading');
      const namespaces = page.namespaces || [];
      if (namespaces.join('\n') !== nsShown) {
        nsShown = namespaces.join('\n');
        const options = [['', 'All namespaces'], ...namespaces.map((n) => [n, n])];
        swap(nsBox, namespaces.length > 1 || st.namespace
          ? select('job-namespace', 'Show jobs of namespace', options, st.namespace, (v) => { st.namespace = v; changed(); })
          : null);
      }
      st.pg.next = page.next_cursor || null;
      const first = st.pg.stack.length * JOBS_PAGE;
      const info = page.total ? `${first + 1}–${first + page.items.length} of ${page.total.toLocaleString('en')}` : '';
      count.textContent = `${page.total.toLocaleString('en')} ${page.total === 1 ? 'job' : 'jobs'}${st.search || st.state || st.namespace ? ' match' : ''}`;
      swap(body, jobsTable(page.items, st));
      swap(pagerBox, page.total > JOBS_PAGE ? pager(st.pg, 'Job pages', info, () => refresh()) : null);
    },
    failed: (e) => swap(body, errorBox(e)),
  };
}

function legend() {
  return h('details', { class: 'legend' }, h('summary', null, 'Legend'),
    h('ul', null, Object.keys(RUN_STATES).map((k) => h('li', null, chip(k)))));
}

function jobsTable(jobs, st) {
  if (!jobs.length) {
    return h('p', { class: 'empty' }, st.search || st.state || st.namespace ? 'No job matches this search.' : 'No jobs yet: no node registered any, and the configuration read here declares none.');
  }
  const rows = jobs.map((j) => h('tr', { 'data-job': j.name },
    h('th', { scope: 'row', class: 'job' }, h('a', { class: 'job-name', href: jobHref(j.name), 'data-key': `job:${j.name}` }, j.name),
      h('div', { class: 'badges' }, badges(j))),
    h('td', { class: 'sched' }, h('div', null, dash(j.schedule_words)),
      h('div', { class: 'muted' }, h('code', null, dash(j.schedule)), j.timezone ? ` · ${j.timezone}` : '')),
    h('td', { class: 'next' }, j.next_fire ? [countdownEl(j.next_fire),
      h('div', { class: 'muted', title: utc(j.next_fire) }, inZone(j.next_fire, j.timezone))] : '—',
      j.paused && j.next_fire ? h('div', { class: 'muted small' }, 'will be skipped: paused') : null),
    h('td', { class: 'strip-cell' }, strip(j.recent, j.name, false),
      h('div', { class: 'now' }, j.running.length ? runningLines(j) : lastRunLine(j))),
    S.me.can_act ? h('td', { class: 'acts' }, actionButtons(j)) : null));
  const heads = ['Job', 'Schedule', 'Next fire', `Last ${STRIP_CELLS} runs, and now`];
  if (S.me.can_act) heads.push(h('span', { class: 'sr-only' }, 'Actions'));
  return table(heads, rows, '', 'jobs-table');
}

// ---------------------------------------------------------------------------------------
// One job.

function jobView(name, params) {
  // `open`: the revisions whose definition is unfolded, kept across redraws.
  const st = { state: params.get('state') || '', pg: newPager('Newer', 'Older'), open: new Set() };
  const head = h('div', { class: 'head' });
  const body = h('div', { class: 'job-body' });
  const history = h('div', { class: 'history' });
  const historyPager = h('div', { class: 'pager-box' });
  const auditBox = h('div');
  const historyFilter = select('history-state', 'Show runs in state', RUN_FILTERS, st.state, (v) => {
    st.state = v;
    st.pg = newPager('Newer', 'Older');
    replaceHash(`${jobHref(name)}${qs({ state: v })}`);
    refresh();
  });
  const el = h('div', { class: 'view job' },
    h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / '), head, body,
    h('section', { class: 'panel' }, h('div', { class: 'panel-head' }, h('h2', null, 'History'), historyFilter),
      history, historyPager),
    h('section', { class: 'panel' }, h('h2', null, 'Recent actions'), auditBox));
  return {
    el, section: 'jobs', title: name,
    async load(signal) {
      const [job, runs, revisions] = await Promise.all([
        api(`/jobs/${enc(name)}`, { signal }),
        api(`/runs${qs({ job: name, state: st.state, cursor: st.pg.cursor, limit: RUNS_PAGE })}`, { signal }),
        api(`/jobs/${enc(name)}/revisions${qs({ limit: REVISIONS_SHOWN + 1 })}`, { signal }),
      ]);
      return { job, runs, revisions: revisions.items };
    },
    render({ job, runs, revisions }) {
      swap(head, h('h1', null, job.name), h('div', { class: 'badges' }, badges(job)), actionButtons(job, true));
      swap(body, jobCards(job), definitionPanel(job, revisions),
        section(`Last ${STRIP_CELLS} runs`, strip(job.recent, job.name, true)),
        revisions.length ? revisionsPanel(revisions, st.open) : null,
        section('Policies per node', registrations(job)));
      st.pg.next = runs.next_cursor || null;
      swap(history, runsTable(runs.items, false));
      swap(historyPager, st.pg.next || st.pg.stack.length
        ? pager(st.pg, 'History pages', `page ${st.pg.stack.length + 1}`, () => refresh()) : null);
      swap(auditBox, actionsTable(job.actions, false));
    },
    failed(e) {
      // A job gone (a managed job deleted before any node registered it) keeps no buttons.
      if (e.status === 404) swap(head, h('h1', null, name));
      swap(body, errorBox(e));
    },
  };
}

function jobCards(job) {
  // In the strip's order of states, then any state this console does not know.
  const order = Object.keys(RUN_STATES);
  const rank = (k) => (order.includes(k) ? order.indexOf(k) : order.length);
  const counts = Object.entries(job.counts_24h).sort(([a], [b]) => rank(a) - rank(b));
  const total = counts.reduce((n, [, c]) => n + c, 0);
  const ended = counts.reduce((n, [k, c]) => (['running', 'waiting', 'skipped'].includes(k) ? n : n + c), 0);
  return h('div', { class: 'cards' },
    h('section', { class: 'card' }, h('h2', null, 'Schedule'),
      h('p', { class: 'big' }, dash(job.schedule_words)),
      h('p', null, h('code', null, dash(job.schedule)), ' in ', h('strong', null, dash(job.timezone))),
      h('p', { class: 'muted' }, job.declared_in ? `Declared in ${job.declared_in}`
        : job.managed ? `Managed in the store (revision ${job.managed.revision})` : 'Known from the nodes\' registrations',
        job.nodes.length ? ` · served by ${job.nodes.join(', ')}` : ' · no node serves it')),
    h('section', { class: 'card' }, h('h2', null, 'Next fire times'),
      job.next_fires.length ? h('ol', { class: 'fires' }, job.next_fires.map((f) => h('li', { title: utc(f.utc) },
        h('span', null, inZone(f.utc, job.timezone),
          job.timezone && job.timezone !== 'UTC' ? h('span', { class: 'muted small utc' }, utc(f.utc)) : null),
        h('span', { class: 'muted' }, countdownEl(f.utc))))) : h('p', { class: 'muted' }, 'none')),
    h('section', { class: 'card' }, h('h2', null, 'Last 24 hours'),
      total ? [h('ul', { class: 'counts' }, counts.map(([state, n]) => h('li', { 'data-count': state }, chip(state),
        h('strong', null, n.toLocaleString('en'))))),
      h('p', { class: 'muted small total' }, `${total.toLocaleString('en')} ${total === 1 ? 'run' : 'runs'}`,
        ended ? ` · ${Math.round((100 * (job.counts_24h.succeeded || 0)) / ended)} % of ended runs succeeded` : '')]
        : h('p', { class: 'muted' }, 'No runs.'),
      job.counts_truncated ? h('p', { class: 'muted small' }, 'Counted over the newest runs only: more ran than one read returns.') : null),
    h('section', { class: 'card' }, h('h2', null, 'Now'),
      job.running.length ? runningLines(job) : h('p', null, 'Idle. Last run: ', lastRunLine(job))));
}

function registrations(job) {
  const hashes = new Set(job.registrations.map((r) => r.definition_hash));
  const rows = job.registrations.map((r) => h('tr', null,
    h('td', null, r.node), h('td', null, h('code', null, r.schedule), ` · ${r.timezone}`),
    h('td', { class: 'policies' }, r.summary),
    h('td', null, h('code', { class: hashes.size > 1 ? 'drifted' : '' }, r.definition_hash)),
    h('td', null, h('time', { datetime: r.first_seen, title: utc(r.first_seen) }, utcShort(r.first_seen))),
    h('td', null, agoEl(r.last_seen))));
  return table(['Node', 'Schedule', 'Policies', 'Definition', 'First seen', 'Confirmed'], rows,
    'No node has registered this job.', 'regs');
}

// ---------------------------------------------------------------------------------------
// Managed jobs: the definition and its revisions on a job's page, the editor, the diff.

/** A JSON value with every object's keys sorted (as the server stores a definition), so
 *  two definitions differing only in key order print alike. */
function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
  return v;
}

const pretty = (v) => JSON.stringify(canonical(v), null, 2);

/** The lines of `a` and `b` as [op, line] (op ' ' kept, '-' removed, '+' added), from
 *  their longest common subsequence: removals before additions where both fit. */
function lineDiff(a, b) {
  if (a.length > DIFF_LINES_MAX || b.length > DIFF_LINES_MAX) {
    return [...a.map((l) => ['-', l]), ...b.map((l) => ['+', l])];
  }
  const w = b.length + 1;
  const lcs = new Uint32Array((a.length + 1) * w);
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      lcs[i * w + j] = a[i] === b[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) {
      out.push([' ', a[i]]);
      i += 1;
      j += 1;
    } else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
      out.push(['-', a[i++]]);
    } else {
      out.push(['+', b[j++]]);
    }
  }
  while (i < a.length) out.push(['-', a[i++]]);
  while (j < b.length) out.push(['+', b[j++]]);
  return out;
}

/** A diff of two definitions (`before` null: all added), each line marked by a sign and
 *  an ins/del element, not by colour alone. */
function diffEl(before, after, label) {
  const ops = lineDiff(before === null ? [] : pretty(before).split('\n'), pretty(after).split('\n'));
  const added = ops.filter(([o]) => o === '+').length;
  const removed = ops.filter(([o]) => o === '-').length;
  const lines = (n) => `${n} ${n === 1 ? 'line' : 'lines'}`;
  const kinds = { '+': ['ins', 'd-add'], '-': ['del', 'd-del'], ' ': ['span', 'd-same'] };
  return h('div', { class: 'diff-box' },
    h('p', { class: 'muted small diff-sum' }, `${lines(removed)} removed (−), ${lines(added)} added (+)`),
    h('pre', { class: 'diff', tabindex: '0', 'aria-label': label }, ops.map(([o, line]) => {
      const [tag, cls] = kinds[o];
      return h(tag, { class: `d-line ${cls}` }, h('span', { class: 'd-sign' }, o === ' ' ? ' ' : o), ` ${line}\n`);
    })));
}

/** A job's definition: a managed job's JSON with its revision and writer; where a
 *  configuration declares it, that file (and no way to edit it here); a deleted managed
 *  job's deletion. Nothing for a job only known from the nodes' registrations. */
function definitionPanel(job, revisions) {
  if (job.managed) {
    const m = job.managed;
    return h('section', { class: 'panel', id: 'definition-panel' }, h('h2', null, 'Definition'),
      h('div', { class: 'definition-grid' },
        facts([
          ['Revision', String(m.revision), 'revision'],
          ['Written by', m.changed_by, 'changed-by'],
          ['When', [h('time', { datetime: m.changed_at, title: utc(m.changed_at, true) }, utc(m.changed_at)), ' (', agoEl(m.changed_at), ')'], 'changed-at'],
        ]),
        h('pre', { class: 'output definition', id: 'definition', tabindex: '0', 'aria-label': `Definition of ${job.name}` },
          pretty(job.definition || {}))));
  }
  if (job.declared_in) {
    return h('section', { class: 'panel', id: 'definition-panel' }, h('h2', null, 'Definition'),
      h('p', { id: 'declared-in' }, 'Declared in ', h('code', null, job.declared_in),
        ': read-only here. Change it in that file; the daemon reads it again on SIGHUP.'));
  }
  const last = revisions[0];
  if (last && last.deleted) {
    return h('section', { class: 'panel', id: 'definition-panel' }, h('h2', null, 'Definition'),
      h('p', { id: 'deleted-note' }, h('span', { 'aria-hidden': 'true' }, '− '), `Deleted by ${last.changed_by} `,
        h('time', { datetime: last.changed_at, title: utc(last.changed_at, true) }, utcShort(last.changed_at)),
        ` (revision ${last.revision}): no node schedules it any more. Its runs and revisions stay.`));
  }
  return null;
}

/** The revisions of a managed job, newest first: who, when, what kind of change, and the
 *  change itself unfolded on demand (`open`: the revisions unfolded, across redraws). */
function revisionsPanel(revisions, open) {
  const shown = revisions.slice(0, REVISIONS_SHOWN);
  const rows = shown.map((r, i) => {
    // The list holds one more than shown, so the oldest shown has its predecessor.
    const older = revisions[i + 1];
    const kind = r.deleted ? 'deleted' : !older || older.deleted ? 'created' : 'changed';
    const [glyph, word] = CHANGES[kind];
    let change = null;
    if (!r.deleted) {
      const det = h('details', { open: open.has(r.revision) },
        h('summary', { 'data-key': `rev:${r.revision}` }, kind === 'created' ? 'definition' : 'what changed'),
        diffEl(kind === 'created' ? null : older.spec, r.spec, `Revision ${r.revision} of ${r.job}`));
      det.addEventListener('toggle', () => (det.open ? open.add(r.revision) : open.delete(r.revision)));
      change = det;
    }
    return h('tr', { 'data-revision': r.revision, 'data-change': kind },
      h('td', { class: 'num' }, String(r.revision)),
      h('td', null, h('span', { class: `change c-${kind}` }, h('span', { 'aria-hidden': 'true' }, `${glyph} `), word)),
      h('td', null, r.changed_by),
      h('td', null, h('time', { datetime: r.changed_at, title: utc(r.changed_at, true) }, utcShort(r.changed_at))),
      h('td', { class: 'rev-change' }, change));
  });
  return h('section', { class: 'panel' }, h('h2', null, 'Revisions'),
    table(['Revision', 'Change', 'By', 'When (UTC)', 'Definition'], rows, 'No revisions.', 'revisions'));
}

/** The editor of a managed job (`name` null: a new job). Drawn once: polling would wipe
 *  what is being typed. */
function editorView(name) {
  const el = h('div', { class: 'view editor' });
  const redraw = (job, unsaved) => swap(el, editorPage(name, job, redraw, unsaved));
  return {
    el, section: 'jobs', title: name === null ? 'New job' : `Edit ${name}`, once: true,
    load: (signal) => (name === null ? null : api(`/jobs/${enc(name)}`, { signal })),
    render: (job) => redraw(job, null),
    failed: (e) => swap(el, editorHead(name), errorBox(e)),
  };
}

function editorHead(name) {
  return [h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / ',
    name === null ? null : [h('a', { href: jobHref(name) }, name), ' / ']),
  h('h1', null, name === null ? 'New job' : ['Edit ', name])];
}

function editorPage(name, job, redraw, unsaved) {
  const head = editorHead(name);
  if (!S.me.can_act) {
    return [head, h('p', { class: 'problem', role: 'alert', id: 'editor-refused' },
      `This token (${S.me.role || 'read only'}) may read only: it cannot ${name === null ? 'create' : 'change'} jobs.`)];
  }
  if (name !== null && !job.managed) {
    const where = job.declared_in
      ? ['It is declared in ', h('code', null, job.declared_in), ': change it there.']
      : ['It is not a managed job: the nodes\' configurations define it.'];
    return [head, h('p', { class: 'problem', role: 'alert', id: 'editor-refused' }, `${name} cannot be edited here. `, where)];
  }
  return [head, editorForm(name, job, redraw, unsaved)];
}

/** Selects the line of `text` where the (dotted) key `param` is written, if it is. */
function selectKey(area, param) {
  const text = area.value;
  let at = -1;
  for (const part of (param || '').split('.')) {
    const found = text.slice(at + 1).search(new RegExp(`"${part.replace(/[^\w-]/g, '\\$&')}"\\s*:`));
    if (found < 0) return;
    at += 1 + found;
  }
  if (at < 0) return;
  const start = text.lastIndexOf('\n', at) + 1;
  const end = text.indexOf('\n', at);
  area.setSelectionRange(start, end < 0 ? text.length : end);
}

function editorForm(name, job, redraw, unsaved) {
  const creating = name === null;
  const base = creating ? null : job.definition || {};
  const revision = creating ? null : job.managed.revision;
  const field = (id) => h('p', { class: 'problem field-error', id: `${id}-error`, role: 'alert', hidden: true });
  const nameInput = creating ? h('input', { type: 'text', id: 'job-name', name: 'name', required: true, autocomplete: 'off',
    spellcheck: 'false', autocapitalize: 'off', 'aria-describedby': 'job-name-help job-name-error' }) : null;
  const nameError = field('job-name');
  const text = creating ? JSON.stringify(NEW_JOB_TEMPLATE, null, 2) : pretty(base);
  const rows = Math.min(EDITOR_ROWS_MAX, Math.max(EDITOR_ROWS_MIN, text.split('\n').length + 1));
  const area = h('textarea', { id: 'job-definition', name: 'definition', rows, required: true, spellcheck: 'false',
    autocomplete: 'off', autocapitalize: 'off', 'aria-describedby': 'job-definition-help job-definition-error' });
  area.value = text;
  const areaError = field('job-definition');
  const general = h('p', { class: 'problem', id: 'editor-error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit', class: 'primary', id: 'editor-submit' }, creating ? 'Create job' : 'Review changes');
  const review = h('section', { class: 'card review', id: 'job-review', tabindex: '-1', hidden: true, 'aria-labelledby': 'review-title' });
  const form = h('form', { class: 'card editor-form', id: 'job-editor', 'aria-label': creating ? 'New job' : `Edit ${name}` },
    creating ? [h('label', { for: 'job-name' }, 'Name'), nameInput,
      h('p', { class: 'hint', id: 'job-name-help' }, 'Unique in the store, no spaces, no @ or #: like billing.invoices-daily.'), nameError] : null,
    h('label', { for: 'job-definition' }, 'Definition (JSON)'),
    h('p', { class: 'hint', id: 'job-definition-help' },
      'The keys of a configuration\'s [[jobs]] entry, without name: schedule (cron, 5 or 6 fields), timezone, ',
      'http (url, method, headers, body, timeout, expect_status), lease, timeout, overlap, misfire, on_crash, max_attempts… ',
      'The server checks it by the configuration\'s rules; commands only where it allows them. Ctrl+Enter: ',
      creating ? 'create.' : 'review.'),
    area, areaError, general,
    h('div', { class: 'buttons' }, h('a', { class: 'button', href: creating ? '#/jobs' : jobHref(name), id: 'editor-cancel' }, 'Cancel'), submit));
  const ed = { name, revision, base, area, nameInput, nameError, areaError, general, submit, review, redraw, creating };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (creating) createJob(ed);
    else reviewEdit(ed);
  });
  area.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });
  const meta = creating ? null : h('p', { class: 'muted', id: 'editor-meta', 'data-revision': revision },
    `Editing revision ${revision}, written by ${job.managed.changed_by} `, agoEl(job.managed.changed_at),
    '. Saving writes only if it is still at this revision.');
  const mine = unsaved === null || unsaved === undefined ? null : h('details', { class: 'card unsaved', id: 'unsaved', open: true },
    h('summary', null, 'Your text, not saved: copy what you need into the editor'),
    h('pre', { class: 'output', tabindex: '0', 'aria-label': 'Your text, not saved' }, unsaved));
  return [meta, mine, form, review];
}

/** Clears the errors of the editor's fields. */
function clearErrors(ed) {
  for (const [box, input] of [[ed.nameError, ed.nameInput], [ed.areaError, ed.area], [ed.general, null]]) {
    box.hidden = true;
    box.textContent = '';
    delete box.dataset.param;
    if (input) input.removeAttribute('aria-invalid');
  }
}

/** Shows the server's (or the parser's) words next to the field `param` names: the name
 *  field for `job`, else the definition, with the key's line selected. Focuses the field. */
function fieldError(ed, param, text) {
  const onName = ed.creating && (param === 'job' || param === 'path');
  const [box, input] = onName ? [ed.nameError, ed.nameInput] : [ed.areaError, ed.area];
  box.replaceChildren(...[text].flat());
  box.dataset.param = param;
  box.hidden = false;
  input.setAttribute('aria-invalid', 'true');
  input.focus();
  if (!onName) selectKey(ed.area, param);
}

function generalError(ed, content) {
  ed.general.replaceChildren(...[content].flat());
  ed.general.hidden = false;
}

/** The definition parsed, or null after showing why it is not JSON. */
function parsed(ed) {
  clearErrors(ed);
  try {
    return { value: JSON.parse(ed.area.value) };
  } catch (e) {
    fieldError(ed, '(body)', `Not JSON: ${e.message}`);
    return null;
  }
}

async function createJob(ed) {
  const def = parsed(ed);
  if (!def) return;
  const job = ed.nameInput.value.trim();
  if (!job) return fieldError(ed, 'job', 'Name the job.');
  ed.submit.disabled = true;
  try {
    const answer = await api(`/jobs/${enc(job)}`, { method: 'PUT', body: def.value, ifNoneMatch: true });
    flash(['Created ', h('strong', null, job), ` (revision ${answer.revision}): every node picks it up within a second.`]);
    location.hash = jobHref(job);
  } catch (e) {
    await createRefused(ed, job, e);
  } finally {
    ed.submit.disabled = false;
  }
}

async function createRefused(ed, job, e) {
  const p = e.problem || {};
  if (e.status === 400 && p.param) return fieldError(ed, p.param, p.detail || problemText(e));
  if (e.status === 409) {
    // Either a managed job has the name (If-None-Match) or a configuration declares it.
    const existing = await api(`/jobs/${enc(job)}`).catch(() => null);
    if (existing && existing.managed) {
      return fieldError(ed, 'job', [`A managed job named ${job} exists already (revision ${existing.managed.revision}): `,
        h('a', { href: `${jobHref(job)}/edit` }, 'edit it'), ' or pick another name.']);
    }
    return fieldError(ed, 'job', problemText(e));
  }
  return generalError(ed, `Not created (${e.status || 'no answer'}): ${problemText(e)}`);
}

/** Shows what saving would change, and asks to confirm; the text is frozen meanwhile. */
function reviewEdit(ed) {
  const def = parsed(ed);
  if (!def) return;
  ed.next = def.value;
  const same = pretty(ed.base) === pretty(def.value);
  const save = h('button', { type: 'button', class: 'primary', id: 'review-save' }, `Save as a new revision`);
  const back = h('button', { type: 'button', id: 'review-back' }, 'Back to editing');
  const error = h('div', { class: 'problem', id: 'save-error', role: 'alert', hidden: true });
  save.addEventListener('click', () => saveEdit(ed, save, error));
  back.addEventListener('click', () => endReview(ed));
  ed.area.readOnly = true;
  ed.submit.hidden = true;
  swap(ed.review,
    h('h2', { id: 'review-title' }, `Review the change to ${ed.name}`),
    same ? h('p', { id: 'review-same' }, `No change: this is revision ${ed.revision}'s definition.`)
      : [diffEl(ed.base, def.value, `Changes to ${ed.name}: revision ${ed.revision} against your text`),
        h('p', null, `Saving replaces revision ${ed.revision} if nobody changed it meanwhile. Every node picks the change up within a second; a changed schedule continues from the last tick handled, and a run in progress finishes as it began.`)],
    error, h('div', { class: 'buttons' }, back, same ? null : save));
  ed.review.hidden = false;
  ed.review.focus();
}

function endReview(ed) {
  ed.review.hidden = true;
  ed.review.replaceChildren();
  ed.area.readOnly = false;
  ed.submit.hidden = false;
  ed.area.focus();
}

async function saveEdit(ed, button, error) {
  button.disabled = true;
  error.hidden = true;
  try {
    const answer = await api(`/jobs/${enc(ed.name)}`, { method: 'PUT', body: ed.next, ifMatch: ed.revision });
    flash(['Saved ', h('strong', null, ed.name), `: revision ${answer.revision} (${answer.outcome}). Every node picks it up within a second.`]);
    location.hash = jobHref(ed.name);
  } catch (e) {
    button.disabled = false;
    const p = e.problem || {};
    if (e.status === 400 && p.param && p.param !== 'If-Match') {
      endReview(ed);
      return fieldError(ed, p.param, p.detail || problemText(e));
    }
    if (e.status === 409) return staleEdit(ed, error, e);
    error.textContent = `Not saved (${e.status || 'no answer'}): ${problemText(e)}`;
    error.hidden = false;
  }
}

/** A save refused because the job moved on: say so, and offer its newest version (the
 *  text typed stays on the page to copy from). */
function staleEdit(ed, error, e) {
  const reload = h('button', { type: 'button', id: 'editor-reload' }, 'Reload the job');
  reload.addEventListener('click', async () => {
    reload.disabled = true;
    try {
      const job = await api(`/jobs/${enc(ed.name)}`);
      ed.redraw(job, ed.area.value);
      flash(['Reloaded ', h('strong', null, ed.name), job.managed ? `: now at revision ${job.managed.revision}, by ${job.managed.changed_by}.` : ': it is no longer a managed job.']);
    } catch (err) {
      reload.disabled = false;
      error.append(h('p', null, `Cannot reload: ${problemText(err)}`));
    }
  });
  error.replaceChildren(h('p', { id: 'conflict' }, h('strong', null, 'Not saved: someone changed this job since you opened it. '),
    `You edited revision ${ed.revision}; the server says: ${problemText(e)}`), reload);
  error.hidden = false;
  reload.focus();
}

// ---------------------------------------------------------------------------------------
// One run.

function runView(id) {
  const head = h('div', { class: 'head' });
  const body = h('div');
  const el = h('div', { class: 'view run' }, head, body);
  return {
    el, section: 'runs', title: `Run ${id}`,
    load: (signal) => api(`/runs/${enc(id)}`, { signal }),
    render(d) {
      const r = d.run;
      const unlock = S.me.can_act && r.state === 'running'
        ? h('div', { class: 'actions' }, h('button', { type: 'button', class: 'danger', 'data-action': 'unlock', 'data-job': r.job,
          'data-key': 'act:unlock', onclick: () => confirmAction('unlock', r.job) }, `Unlock ${r.job}`)) : null;
      swap(head, h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, 'Jobs'), ' / ', h('a', { href: jobHref(r.job) }, r.job), ' / '),
        h('h1', null, h('span', { class: 'muted' }, 'Run '), h('code', { class: 'run-id' }, r.id)),
        h('div', { class: 'badges', id: 'run-state' }, chip(r.state)), unlock);
      swap(body, h('div', { class: 'cards two' }, runFacts(r, d.attempts.length), runTimes(r)),
        section(`Attempts at this tick (${d.attempts.length})`, attemptsTable(d.attempts, r)),
        section('Output (its last bytes)', d.output
          ? h('pre', { class: 'output', tabindex: '0', 'aria-label': 'Output' }, d.output)
          : h('p', { class: 'empty' }, r.state === 'running' ? 'No output yet.' : 'No output recorded.')));
    },
    failed: (e) => swap(body, errorBox(e)),
  };
}

function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v, key]) =>
    [h('dt', null, k), h('dd', key ? { 'data-field': key } : null, v)]));
}

function runFacts(r, attempts) {
  return h('section', { class: 'card' }, h('h2', null, 'Run'), facts([
    ['State', [chip(r.state), r.reason ? h('span', { class: 'reason' }, ` ${r.reason}`) : null], 'state'],
    ['Job', h('a', { href: jobHref(r.job) }, r.job), 'job'],
    ['Trigger', r.trigger, 'trigger'],
    ['Attempt', `${r.attempt} of ${attempts}`, 'attempt'],
    ['Node', r.node, 'node'],
    ['Fencing token', dash(r.fencing_token), 'token'],
    ['Exit code', dash(r.exit_code), 'exit'],
  ]));
}

function runTimes(r) {
  const t = (iso) => (iso ? h('time', { datetime: iso, title: new Date(iso).toString() }, utc(iso, true)) : '—');
  return h('section', { class: 'card' }, h('h2', null, 'Times'), facts([
    ['Scheduled', t(r.scheduled_at), 'scheduled'],
    ['Claimed', t(r.claimed_at), 'claimed'],
    ['Started', t(r.started_at), 'started'],
    ['Ended', t(r.finished_at), 'ended'],
    r.lease_until ? ['Lease until', [t(r.lease_until), ' (', countdownEl(r.lease_until), ')'], 'lease'] : null,
    ['Lateness', r.lateness_ms === null ? '—' : `${ms(r.lateness_ms)} after the instant`, 'lateness'],
    ['Duration', r.state === 'running' && r.started_at ? ['running for ', agoEl(r.started_at)] : ms(r.duration_ms), 'duration'],
  ]));
}

function attemptsTable(attempts, current) {
  const rows = attempts.map((a) => h('tr', a.id === current.id ? { 'aria-current': 'true', class: 'current' } : null,
    h('td', { class: 'num' }, a.id === current.id ? `${a.attempt}` : h('a', { href: runHref(a.id) }, `${a.attempt}`)),
    h('td', null, chip(a.state)), h('td', null, a.node), h('td', { class: 'num' }, dash(a.fencing_token)),
    h('td', null, utc(a.claimed_at, true)), h('td', null, a.started_at ? utc(a.started_at, true) : '—'),
    h('td', null, a.finished_at ? utc(a.finished_at, true) : '—'), h('td', { class: 'reason' }, dash(a.reason))));
  return table(['Attempt', 'State', 'Node', 'Token', 'Claimed', 'Started', 'Ended', 'Reason'], rows, 'No attempts.', 'attempts');
}

// ---------------------------------------------------------------------------------------
// The run history of the fleet, the nodes, the audit log.

function runsView(params) {
  const st = { job: params.get('job') || '', namespace: params.get('namespace') || '', state: params.get('state') || '',
    node: params.get('node') || '', pg: newPager('Newer', 'Older') };
  const body = h('div', { class: 'sheet' });
  const pagerBox = h('div', { class: 'pager-box' });
  const filters = () => ({ job: st.job, namespace: st.namespace, state: st.state, node: st.node });
  const changed = () => {
    st.pg = newPager('Newer', 'Older');
    replaceHash(`#/runs${qs(filters())}`);
    refresh();
  };
  const text = (id, label, key) => {
    const i = h('input', { type: 'search', id, placeholder: label, value: st[key], autocomplete: 'off', spellcheck: 'false', 'aria-label': label });
    i.addEventListener('change', () => { st[key] = i.value.trim(); changed(); });
    return i;
  };
  const el = h('div', { class: 'view runs' }, h('div', { class: 'head' }, h('h1', null, 'Runs')),
    h('form', { class: 'toolbar', onsubmit: (e) => e.preventDefault() },
      text('runs-job', 'Job (exact name)', 'job'),
      text('runs-namespace', 'Namespace', 'namespace'),
      select('runs-state', 'Show runs in state', RUN_FILTERS, st.state, (v) => { st.state = v; changed(); }),
      text('runs-node', 'Node', 'node')),
    body, pagerBox);
  return {
    el, section: 'runs', title: 'Runs',
    load: (signal) => api(`/runs${qs({ ...filters(), cursor: st.pg.cursor, limit: RUNS_PAGE * 2 })}`, { signal }),
    render(page) {
      st.pg.next = page.next_cursor || null;
      swap(body, runsTable(page.items, true));
      swap(pagerBox, st.pg.next || st.pg.stack.length ? pager(st.pg, 'Run pages', `page ${st.pg.stack.length + 1}`, () => refresh()) : null);
    },
    failed: (e) => swap(body, errorBox(e)),
  };
}

function nodesView() {
  const body = h('div', { class: 'sheet' });
  const el = h('div', { class: 'view nodes' }, h('div', { class: 'head' }, h('h1', null, 'Nodes'),
    h('span', { class: 'muted' }, 'alive: a heartbeat within 15 s · stale: silent without a goodbye · gone: said goodbye')), body);
  return {
    el, section: 'nodes', title: 'Nodes',
    load: (signal) => api('/nodes', { signal }),
    render(page) {
      const rows = page.items.map((n) => h('tr', { 'data-node': n.node },
        h('th', { scope: 'row' }, n.node),
        h('td', null, h('span', { class: `live-state l-${n.liveness}`, 'data-liveness': n.liveness },
          h('span', { 'aria-hidden': 'true' }, `${LIVENESS[n.liveness] || '?'} `), n.liveness)),
        h('td', null, n.version),
        h('td', null, h('time', { datetime: n.started_at, title: utc(n.started_at, true) }, utcShort(n.started_at))),
        h('td', { title: utc(n.last_seen, true) }, n.left_at ? `left ${utcShort(n.left_at)}` : `${coarse(Math.floor(n.last_seen_ago_ms / 1000))} ago`),
        h('td', { class: 'num' }, n.jobs),
        h('td', { class: 'held' }, n.running.length ? n.running.map((id) => h('a', { href: runHref(id), class: 'held-run' }, id)) : '—')));
      swap(body, table(['Node', 'Liveness', 'Version', 'Started (UTC)', 'Last heartbeat', 'Jobs', 'Runs held'], rows,
        'No node has sent a heartbeat to this store.', 'nodes-table'));
    },
    failed: (e) => swap(body, errorBox(e)),
  };
}

function actionsView(params) {
  const st = { job: params.get('job') || '' };
  const body = h('div', { class: 'sheet' });
  const input = h('input', { type: 'search', id: 'audit-job', placeholder: 'Job (exact name)', value: st.job, 'aria-label': 'Job', autocomplete: 'off' });
  input.addEventListener('change', () => {
    st.job = input.value.trim();
    replaceHash(`#/actions${qs({ job: st.job })}`);
    refresh();
  });
  const el = h('div', { class: 'view audit' }, h('div', { class: 'head' }, h('h1', null, 'Audit log'),
    h('span', { class: 'muted' }, `the newest ${ACTIONS_SHOWN} operator actions`)),
  h('form', { class: 'toolbar', onsubmit: (e) => e.preventDefault() }, input), body);
  return {
    el, section: 'actions', title: 'Audit log',
    load: (signal) => api(`/actions${qs({ job: st.job, limit: ACTIONS_SHOWN })}`, { signal }),
    render: (page) => swap(body, actionsTable(page.items, true)),
    failed: (e) => swap(body, errorBox(e)),
  };
}

function notFoundView() {
  const el = h('div', { class: 'view' }, h('h1', null, 'Not found'),
    h('p', null, 'No such page in the console. ', h('a', { href: '#/jobs' }, 'Go to the jobs.')));
  return { el, section: '', title: 'Not found', load: async () => null, render: () => {} };
}

// ---------------------------------------------------------------------------------------
// Actions: a confirmation with a reason, the API's problem shown when it refuses.

let pending = null;

/** Asks to confirm an action on `job`; `revision` is the one a delete expects. */
function confirmAction(kind, job, revision) {
  const a = ACTIONS[kind];
  pending = { kind, job, revision, opener: document.activeElement };
  $('confirm-title').textContent = `${a.verb} ${job}?`;
  $('confirm-text').textContent = revision === undefined ? a.text : `${a.text} (It is at revision ${revision}: deleted only if nobody changed it since.)`;
  $('confirm-reason-box').hidden = !!a.noReason;
  $('confirm-need').textContent = a.reason ? '(required)' : '(optional)';
  const reason = $('confirm-reason');
  reason.value = '';
  reason.required = a.reason;
  reason.placeholder = a.reason ? 'Why are the runs ended?' : 'Why? (optional)';
  $('confirm-error').hidden = true;
  const ok = $('confirm-ok');
  ok.textContent = a.verb;
  ok.className = a.danger ? 'danger' : 'primary';
  ok.disabled = false;
  $('confirm').showModal();
  if (a.noReason) $('confirm-cancel').focus();
  else reason.focus();
}

async function submitAction(ev) {
  ev.preventDefault();
  if (!pending) return;
  const { kind, job, revision } = pending;
  const reason = $('confirm-reason').value.trim();
  const error = $('confirm-error');
  const ok = $('confirm-ok');
  ok.disabled = true;
  // A required reason is always sent, even blank: the server says what it wants.
  const body = reason || ACTIONS[kind].reason ? { reason } : {};
  try {
    const answer = kind === 'delete'
      ? await api(`/jobs/${enc(job)}`, { method: 'DELETE', ifMatch: revision })
      : await api(`/jobs/${enc(job)}/${kind}`, { method: 'POST', body });
    closeConfirm();
    flash(done(kind, job, answer));
    refresh();
  } catch (e) {
    error.textContent = `${ACTIONS[kind].verb} refused (${e.status || 'no answer'}): ${problemText(e)}`;
    error.hidden = false;
    ok.disabled = false;
  }
}

function done(kind, job, answer) {
  if (kind === 'trigger') {
    return ['Triggered ', h('strong', null, job), ': run ', h('a', { href: runHref(answer.run_id), id: 'flash-run', 'data-run-id': answer.run_id }, answer.run_id),
      ` ${answer.state === 'requested' ? 'requested; a node picks it up within a second' : answer.state}.`];
  }
  if (kind === 'unlock') {
    const ended = answer.ended || [];
    return ended.length
      ? ['Unlocked ', h('strong', null, job), ': ended ', ended.map((id, i) => [i ? ', ' : '', h('a', { href: runHref(id), 'data-run-id': id }, id)]), ' as abandoned.']
      : ['Unlocked ', h('strong', null, job), ': nothing was running.'];
  }
  if (kind === 'delete') {
    return ['Deleted ', h('strong', null, job), ` (revision ${answer.revision}): nodes stop scheduling it within a second; a run in progress finishes.`];
  }
  return [kind === 'pause' ? 'Paused ' : 'Resumed ', h('strong', null, job), '.'];
}

function closeConfirm() {
  const opener = pending && pending.opener;
  pending = null;
  if ($('confirm').open) $('confirm').close();
  // The opener may have been redrawn meanwhile: focus its successor by key.
  const key = opener && opener.getAttribute && opener.getAttribute('data-key');
  const target = key ? document.querySelector(`[data-key="${CSS.escape(key)}"]`) : null;
  if (target) target.focus();
}

function flash(content, bad) {
  clearTimeout(S.flashTimer);
  const box = $('flash');
  box.className = bad ? 'flash bad' : 'flash ok';
  const close = h('button', { type: 'button', class: 'quiet', 'aria-label': 'Dismiss' }, '×');
  close.addEventListener('click', () => box.replaceChildren());
  box.replaceChildren(h('div', { class: 'flash-body' }, h('span', null, content), close));
  S.flashTimer = setTimeout(() => box.replaceChildren(), FLASH_MS);
}

// ---------------------------------------------------------------------------------------

function boot() {
  window.addEventListener('hashchange', route);
  document.addEventListener('visibilitychange', onVisibility);
  $('sign-out').addEventListener('click', () => signOut('Signed out.'));
  $('skip').addEventListener('click', () => $('main').focus());
  $('confirm-form').addEventListener('submit', submitAction);
  $('confirm-cancel').addEventListener('click', closeConfirm);
  $('confirm').addEventListener('close', () => { pending = null; });
  document.addEventListener('keydown', (ev) => {
    const typing = ev.target.closest && ev.target.closest('input, textarea, select, dialog');
    if (ev.key === '/' && !typing && $('job-search')) {
      ev.preventDefault();
      $('job-search').focus();
    }
  });
  setInterval(tickClocks, CLOCK_MS);
  start();
}

boot();
