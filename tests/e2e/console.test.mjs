// The web console, end to end: a real daemon (started by scripts/e2e) and a real headless
// Chromium (Debian's /usr/bin/chromium, driven by playwright-core; no browser is downloaded).
// Each step is one node:test test; they run in order, and after a failure the rest are
// skipped, so the first failure is the one reported. A failing step leaves a screenshot in
// $E2E_ARTIFACTS.
//
// Environment: E2E_BASE_URL, E2E_OPS_TOKEN (role operate), E2E_VIEW_TOKEN (role read),
// E2E_SHOTS (where the docs' screenshots go; unset: none), E2E_ARTIFACTS, CHROMIUM.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { chromium } from 'playwright-core';

const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this test through scripts/e2e`);
  return v;
};
const BASE = need('E2E_BASE_URL');
const OPS = need('E2E_OPS_TOKEN');
const VIEW = need('E2E_VIEW_TOKEN');
const SHOTS = process.env.E2E_SHOTS || '';
const ARTIFACTS = process.env.E2E_ARTIFACTS || join(tmpdir(), 'solocron-e2e-artifacts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
/** Longest wait for something the daemon does by itself (a tick, a claim, a lease check). */
const WAIT_MS = 20000;
/** Longest a step may take. */
const STEP_MS = 90000;
/** How long the hidden page is watched for requests. */
const HIDDEN_WATCH_MS = 5000;
const VIEWPORT = { width: 1280, height: 800 };

let browser;
let page;
let failed = false;
/** Console errors and uncaught exceptions (a CSP violation is one): none is allowed. */
const problems = [];
/** Ids the steps hand on. */
const seen = {};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls `probe` until it returns something truthy; fails naming `what`. */
async function until(what, probe, ms = WAIT_MS) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await probe();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`waited ${ms} ms for ${what}${last ? ` (last error: ${last.message})` : ''}`);
    await sleep(200);
  }
}

function step(name, fn) {
  test(name, { timeout: STEP_MS }, async (t) => {
    if (failed) return t.skip('an earlier step failed');
    try {
      await fn();
    } catch (e) {
      failed = true;
      const shot = join(ARTIFACTS, `${name.replace(/[^a-z0-9]+/gi, '-')}.png`);
      await page?.screenshot({ path: shot }).then(() => console.error(`  screenshot of the failure: ${shot}`), () => {});
      console.error(`  page at failure: ${page?.url()}`);
      throw e;
    }
  });
}

/** A request from the test itself, not the page. Its body is always read: an unread body
 *  holds its socket open, and that keeps this process alive long after the last step. */
async function http(path, { token, method = 'GET', body } = {}) {
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(BASE + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

async function api(path, { token = OPS, method = 'GET', body } = {}) {
  const res = await http(path, { token, method, body });
  const data = JSON.parse(res.text);
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${data.detail}`);
  return data;
}

async function go(hash) {
  await page.evaluate((h) => { location.hash = h; }, hash);
}

const row = (job) => page.locator(`.jobs-table tr[data-job="${job}"]`);

async function confirm(reason) {
  const dialog = page.locator('dialog#confirm');
  await until('the confirmation dialog to open', () => dialog.evaluate((d) => d.open));
  if (reason !== undefined) await page.fill('#confirm-reason', reason);
  await page.click('#confirm-ok');
  await until('the confirmation dialog to close', async () => !(await dialog.evaluate((d) => d.open)));
}

async function signIn(token) {
  await page.fill('#token', token);
  await page.click('#signin button[type=submit]');
}

async function search(text) {
  await go('#/jobs');
  await page.fill('#job-search', text);
  await until(`the job list to show only "${text}"`, async () => {
    const names = await page.locator('.jobs-table tbody tr').evaluateAll((rs) => rs.map((r) => r.dataset.job));
    return names.length === 1 && names[0] === text;
  });
}

async function runState() {
  return (await page.locator('[data-field="state"] .chip').getAttribute('data-state')) || '';
}

async function shoot(file) {
  if (!SHOTS) return;
  await page.evaluate(() => document.getElementById('flash').replaceChildren());
  await page.evaluate(() => document.activeElement && document.activeElement.blur());
  await page.mouse.move(VIEWPORT.width - 1, VIEWPORT.height - 1); // no hover highlight
  await page.screenshot({ path: join(SHOTS, file) });
  console.log(`  screenshot ${join(SHOTS, file)}`);
}

async function noActionButtons(where) {
  const buttons = await page.locator('button[data-action]').count();
  const named = await page.getByRole('button', { name: /^(Trigger|Pause|Resume|Unlock)\b/ }).count();
  assert.equal(buttons + named, 0, `${where}: a read-only caller sees ${buttons + named} action button(s)`);
}

before(async () => {
  const t0 = Date.now();
  mkdirSync(ARTIFACTS, { recursive: true });
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  const context = await browser.newContext({ viewport: VIEWPORT, colorScheme: 'light', timezoneId: 'UTC' });
  page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  page.on('console', (m) => {
    // The browser logs every 4xx answer as a failed load: the sign-in probes ask for 401s,
    // and the blank unlock reason for a 400. Any other (a missing file: 404) is a problem.
    if (m.type() === 'error' && !/status of 40[01] /.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  // A paused job for the screenshots (the console's own pause is tested on `tick`).
  await until('the API to answer', () => api('/api/v1/whoami'));
  await api('/api/v1/jobs/weekly-report/pause', { method: 'POST', body: { reason: 'quarter-end freeze' } });
  console.log(`  browser ${browser.version()} up, API answering, in ${Date.now() - t0} ms`);
});

after(async () => {
  const t0 = Date.now();
  await browser?.close();
  console.log(`  browser closed in ${Date.now() - t0} ms`);
});

step('the console is served with a strict Content-Security-Policy', async () => {
  const res = await http('/');
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/html/);
  const csp = res.headers.get('content-security-policy') || '';
  assert.match(csp, /default-src 'self'/, `CSP: ${csp}`);
  assert.match(csp, /script-src 'self'/, `CSP: ${csp}`);
  assert.doesNotMatch(csp, /unsafe/, `CSP: ${csp}`);
  const js = await http('/console/app.js');
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  const css = await http('/console/style.css');
  assert.match(css.headers.get('content-type'), /^text\/css/);
});

step('a wrong token is refused with the API\'s words, and no way around it is offered', async () => {
  await page.goto(BASE);
  await page.waitForSelector('#token');
  await signIn('not-a-token-of-this-server');
  const error = page.locator('#signin-error');
  await until('the sign-in error', () => error.isVisible());
  assert.match(await error.textContent(), /unknown token/);
  assert.equal(await page.locator('#anonymous').count(), 0, 'a server with tokens must not offer "continue without a token"');
});

step('signing in with the operate token shows who you are', async () => {
  await signIn(OPS);
  await until('the name in the header', async () => (await page.textContent('#who-name')) === 'ops');
  assert.equal(await page.textContent('#who-role'), 'operate');
  assert.ok(!page.url().includes(OPS), 'the token must not be in the address');
});

step('the job list pages through its 66 jobs on the server', async () => {
  const rows = page.locator('.jobs-table tbody tr');
  const info = page.locator('nav.pager span');
  await until('the first page of 50 jobs', async () => (await rows.count()) === 50);
  assert.equal(await page.textContent('#jobs-count'), '66 jobs');
  assert.equal(await info.textContent(), '1–50 of 66');
  await page.getByRole('button', { name: 'Next →' }).click();
  await until('the second page', async () => (await rows.count()) === 16);
  assert.equal(await info.textContent(), '51–66 of 66');
  assert.equal(await rows.first().getAttribute('data-job'), 'yearly-archive-45');
  await page.getByRole('button', { name: '← Previous' }).click();
  await until('the first page again', async () => (await rows.first().getAttribute('data-job')) === 'flaky-upstream');
});

step('searching finds tick', async () => {
  await search('tick');
  assert.match(page.url(), /#\/jobs\?search=tick/);
  const cells = row('tick').locator('td.sched');
  assert.match(await cells.textContent(), /every 2 seconds/);
  assert.match(await row('tick').locator('td.next time').textContent(), /^(in \d+ s|due now)$/);
});

step('tick\'s strip fills with succeeded runs, each readable without colour', async () => {
  const ok = row('tick').locator('a.cell[data-state="succeeded"]');
  await until('3 succeeded runs in tick\'s strip', async () => (await ok.count()) >= 3);
  const first = ok.first();
  assert.equal((await first.textContent()).trim(), '✓');
  assert.match(await first.getAttribute('title'), /^succeeded · \d{4}-\d\d-\d\d /);
  assert.match(await first.getAttribute('href'), /^#\/runs\/tick%40/);
});

step('triggering tick asks for a reason, and the manual run appears and succeeds', async () => {
  await row('tick').locator('button[data-action="trigger"]').click();
  assert.equal(await page.textContent('#confirm-title'), 'Trigger tick?');
  await confirm('e2e: manual run');
  const link = page.locator('#flash-run');
  await until('the flash naming the requested run', () => link.isVisible());
  const id = await link.getAttribute('data-run-id');
  seen.manual = id;
  const cell = row('tick').locator(`a.cell[data-run-id="${id}"]`);
  await until(`run ${id} in tick's strip`, async () => (await cell.count()) === 1);
  await cell.click();
  await until('the run page', async () => (await page.locator('.run-id').textContent()) === id);
  await until(`run ${id} to succeed`, async () => (await runState()) === 'succeeded');
  assert.equal(await page.textContent('[data-field="trigger"]'), 'manual');
  assert.equal(await page.textContent('[data-field="node"]'), 'n1');
  assert.match(await page.textContent('pre.output'), /tick/);
  await go('#/jobs/tick');
  const history = page.locator(`.history tr[data-run-id="${id}"]`);
  await until(`run ${id} in tick's history`, async () => (await history.count()) === 1);
  assert.match(await history.textContent(), /manual/);
  const audit = page.locator('.audit tbody tr').first();
  assert.match(await audit.textContent(), /trigger.*ops.*e2e: manual run/);
});

step('pausing tick shows who paused it and why; resuming clears it', async () => {
  await search('tick');
  await row('tick').locator('button[data-action="pause"]').click();
  await confirm('e2e: maintenance window');
  const badge = row('tick').locator('[data-badge="paused"]');
  await until('the paused badge', () => badge.isVisible());
  assert.match(await badge.textContent(), /Paused by ops: e2e: maintenance window/);
  await row('tick').locator('button[data-action="resume"]').click();
  await confirm();
  await until('the paused badge to go', async () => (await badge.count()) === 0);
  await row('tick').locator('button[data-action="pause"]').waitFor();
});

step('unlocking stuck needs a reason and ends its run as abandoned', async () => {
  await search('stuck');
  await row('stuck').locator('button[data-action="trigger"]').click();
  await confirm('e2e: start the stuck job');
  const running = row('stuck').locator('[data-running]');
  await until('stuck to run', async () => (await running.count()) === 1);
  const id = await running.getAttribute('data-running');
  assert.match(await running.textContent(), /running on n1 · token \d+ · lease (in \d+ s|due now)/);
  await row('stuck').locator('button[data-action="unlock"]').click();
  assert.equal(await page.textContent('#confirm-need'), '(required)');
  await page.click('#confirm-ok');
  assert.ok(await page.locator('dialog#confirm').evaluate((d) => d.open), 'unlock went ahead without a reason');
  assert.ok(await page.locator('#confirm-reason').evaluate((i) => i.validity.valueMissing), 'the empty reason is not flagged');
  await page.fill('#confirm-reason', '   ');
  await page.click('#confirm-ok');
  const refusal = page.locator('#confirm-error');
  await until('the API\'s refusal of a blank reason, in the dialog', () => refusal.isVisible());
  assert.match(await refusal.textContent(), /^Unlock refused \(400\): reason: /);
  assert.equal(await running.count(), 1, 'a refused unlock ended the run');
  await confirm('e2e: the job hangs');
  await until('the flash naming the abandoned run', async () => /as abandoned/.test(await page.textContent('#flash')));
  await go(`#/runs/${encodeURIComponent(id)}`);
  await until(`run ${id} to be abandoned`, async () => (await runState()) === 'abandoned');
  assert.match(await page.textContent('[data-field="state"]'), /e2e: the job hangs/);
  seen.abandoned = id;
});

step('the nodes view shows n1 alive', async () => {
  await page.click('#nav a[data-view="nodes"]');
  const live = page.locator('tr[data-node="n1"] [data-liveness]');
  await until('n1 in the nodes view', async () => (await live.count()) === 1);
  assert.equal(await live.getAttribute('data-liveness'), 'alive');
  assert.match(await live.textContent(), /● alive/);
});

step('nothing is read while the page is hidden, and reading resumes when it shows', async () => {
  let requests = 0;
  const count = (r) => { if (r.url().includes('/api/v1/')) requests += 1; };
  page.on('request', count);
  await page.evaluate(() => {
    Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
    document.dispatchEvent(new Event('visibilitychange'));
  });
  await sleep(500); // a read already in flight may land
  requests = 0;
  await sleep(HIDDEN_WATCH_MS);
  const hidden = requests;
  await page.evaluate(() => {
    delete document.visibilityState;
    document.dispatchEvent(new Event('visibilitychange'));
  });
  await until('a read once visible again', async () => requests > hidden, 5000);
  page.off('request', count);
  assert.equal(hidden, 0, `${hidden} API request(s) while hidden`);
});

step('screenshots: jobs (light and dark), a job, a run', async () => {
  await go('#/jobs');
  await until('every job listed', async () => (await page.locator('.jobs-table tbody tr').count()) >= 6);
  await until('slow-import to have runs', async () => (await row('slow-import').locator('a.cell').count()) >= 1);
  await sleep(300);
  await shoot('jobs-light.png');
  await page.emulateMedia({ colorScheme: 'dark' });
  await sleep(300);
  await shoot('jobs-dark.png');
  await page.emulateMedia({ colorScheme: 'light' });
  await go('#/jobs/flaky-upstream');
  await until('flaky-upstream\'s page', async () => (await page.locator('.job h1').textContent()) === 'flaky-upstream');
  await sleep(300);
  await shoot('job.png');
  const failures = await api('/api/v1/runs?job=flaky-upstream&state=failed&limit=1');
  const id = failures.runs[0]?.id || seen.manual;
  await go(`#/runs/${encodeURIComponent(id)}`);
  await until('the run page', async () => (await page.locator('.run-id').textContent()) === id);
  await sleep(300);
  await shoot('run.png');
});

step('signed in with the read token, no action button is shown anywhere', async () => {
  await page.click('#sign-out');
  await page.waitForSelector('#token');
  await signIn(VIEW);
  await until('the read role in the header', async () => (await page.textContent('#who-role')) === 'read');
  await go('#/jobs');
  await until('the job list', async () => (await page.locator('.jobs-table tbody tr').count()) >= 6);
  await noActionButtons('the job list');
  await go('#/jobs/stuck');
  await until('stuck\'s page', async () => (await page.locator('.job h1').textContent()) === 'stuck');
  await noActionButtons('a job page');
  await go(`#/runs/${encodeURIComponent(seen.manual)}`);
  await until('the run page', async () => (await page.locator('.run-id').textContent()) === seen.manual);
  await noActionButtons('a run page');
  await page.click('#nav a[data-view="nodes"]');
  await page.locator('tr[data-node="n1"]').waitFor();
  await noActionButtons('the nodes view');
  const refused = await http('/api/v1/jobs/tick/pause', { token: VIEW, method: 'POST', body: {} });
  assert.equal(refused.status, 403, 'the API must refuse a read token\'s action');
});

step('no page raised a script error or a policy violation', async () => {
  assert.deepEqual(problems, [], `problems in the page:\n${problems.join('\n')}`);
});
