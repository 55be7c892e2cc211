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
/** The editor's screenshot is taller: the form and the diff under it. */
const EDITOR_SHOT_HEIGHT = 1000;
/** The managed job the console creates, edits and deletes. */
const MANAGED = 'e2e-managed';
/** Nothing listens on the discard port: the managed job's runs fail, as runs may. */
const REFUSED_URL = 'http://127.0.0.1:9/e2e';
/** overlap = "allow": a manual run requested as a scheduled tick is claimed would otherwise
 *  be recorded as skipped (as for `tick` in scripts/e2e). */
const DEFINITION = { schedule: '*/5 * * * * *', http: { url: REFUSED_URL, timeout: '2s' }, lease: '30s', overlap: 'allow' };

let browser;
let page;
let failed = false;
/** Console errors and uncaught exceptions (a CSP violation is one): none is allowed. */
const problems = [];
/** Ids the steps hand on. */
const seen = {};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The job's page, once drawn. */
async function openJob(job) {
  await go(`#/jobs/${encodeURIComponent(job)}`);
  await until(`${job}'s page`, async () => (await page.locator('.job h1').textContent()) === job);
}

/** The editor's definition text, replaced: `edit(text)` gives the new text. */
async function editDefinition(edit) {
  await page.locator('#job-editor').waitFor();
  const text = await page.inputValue('#job-definition');
  await page.fill('#job-definition', edit(text));
  return text;
}

/** A managed job as the API shows it. */
const managed = (job) => api(`/api/v1/jobs/${encodeURIComponent(job)}`);

/** The revision a flash message starting with `words` names (an earlier flash may still
 *  show: the words tell them apart). */
async function flashedRevision(words) {
  const re = new RegExp(`^${words.replace(/[()]/g, '\\$&')}:? \\(?revision (\\d+)`);
  const text = await until(`the flash "${words} … revision N"`, async () => {
    const t = await page.textContent('#flash');
    return re.test(t) && t;
  });
  return Number(re.exec(text)[1]);
}

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
async function http(path, { token, method = 'GET', body, ifMatch } = {}) {
  const headers = { 'Content-Type': 'application/json' };
  if (ifMatch !== undefined) headers['If-Match'] = `"${ifMatch}"`;
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

/** A screenshot for the docs; `height`: of a taller window than the test's. */
async function shoot(file, height = VIEWPORT.height) {
  if (!SHOTS) return;
  await page.evaluate(() => document.getElementById('flash').replaceChildren());
  await page.evaluate(() => document.activeElement && document.activeElement.blur());
  if (height !== VIEWPORT.height) await page.setViewportSize({ ...VIEWPORT, height });
  await page.mouse.move(VIEWPORT.width - 1, height - 1); // no hover highlight
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(SHOTS, file) });
  if (height !== VIEWPORT.height) await page.setViewportSize(VIEWPORT);
  console.log(`  screenshot ${join(SHOTS, file)}`);
}

async function noActionButtons(where) {
  const buttons = await page.locator('[data-action]').count();
  const named = await page.getByRole('button', { name: /^(Trigger|Pause|Resume|Unlock|New job|Edit|Delete)\b/ }).count();
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
    // the blank unlock reason and the bad definitions for 400s, the stale edit and the
    // second creation for 409s. Any other (a missing file: 404) is a problem.
    if (m.type() === 'error' && !/status of 40[019] /.test(m.text())) problems.push(`console: ${m.text()}`);
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

step('the job list pages through its 67 jobs on the server', async () => {
  const rows = page.locator('.jobs-table tbody tr');
  const info = page.locator('nav.pager span');
  await until('the first page of 50 jobs', async () => (await rows.count()) === 50);
  assert.equal(await page.textContent('#jobs-count'), '67 jobs');
  assert.equal(await info.textContent(), '1–50 of 67');
  await page.getByRole('button', { name: 'Next →' }).click();
  await until('the second page', async () => (await rows.count()) === 17);
  assert.equal(await info.textContent(), '51–67 of 67');
  assert.equal(await rows.first().getAttribute('data-job'), 'yearly-archive-44');
  await page.getByRole('button', { name: '← Previous' }).click();
  await until('the first page again', async () => (await rows.first().getAttribute('data-job')) === 'billing/invoices');
});

step('filtering by namespace lists that namespace\'s jobs only, and the filter is in the address', async () => {
  await go('#/jobs');
  const ns = page.locator('#job-namespace');
  await until('the namespace filter', () => ns.isVisible());
  assert.deepEqual(await ns.locator('option').evaluateAll((os) => os.map((o) => o.value)), ['', 'billing', 'default']);
  await ns.selectOption('billing');
  await until('only billing\'s job', async () => {
    const names = await page.locator('.jobs-table tbody tr').evaluateAll((rs) => rs.map((r) => r.dataset.job));
    return names.length === 1 && names[0] === 'billing/invoices';
  });
  assert.match(page.url(), /namespace=billing/);
  assert.equal(await page.textContent('#jobs-count'), '1 job match');
  await page.click('a[data-key="job:billing/invoices"]');
  await until('the job page of billing/invoices', async () => (await page.textContent('h1')).includes('billing/invoices'));
  // A run of billing's job, among the other namespace's many: the runs view keeps to billing.
  await api(`/api/v1/jobs/${encodeURIComponent('billing/invoices')}/trigger`, { method: 'POST', body: { reason: 'e2e: namespaces' } });
  await go('#/runs?namespace=billing');
  assert.equal(await page.inputValue('#runs-namespace'), 'billing');
  const runJobs = () => page.locator('.view.runs tbody tr td:first-child').evaluateAll((cs) => cs.map((c) => c.textContent));
  await until('billing\'s run, alone', async () => {
    const jobs = await runJobs();
    return jobs.length > 0 && jobs.every((j) => j === 'billing/invoices');
  });
  await page.fill('#runs-namespace', 'default');
  await page.press('#runs-namespace', 'Enter');
  await until('default\'s runs, without billing\'s', async () => {
    const jobs = await runJobs();
    return jobs.length > 0 && jobs.every((j) => !j.includes('/'));
  });
  await go('#/jobs');
  await until('every job again', async () => (await page.textContent('#jobs-count')) === '67 jobs');
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

step('every list the console reads answers one envelope: items, then next_cursor', async () => {
  for (const path of ['/jobs?limit=2', '/runs?limit=2', '/nodes', '/actions', '/jobs/tick/revisions']) {
    const page = await api(`/api/v1${path}`);
    assert.ok(Array.isArray(page.items), `${path}: ${JSON.stringify(page).slice(0, 200)}`);
    assert.ok('next_cursor' in page, `${path} has no next_cursor`);
  }
  assert.equal(typeof (await api('/api/v1/jobs?limit=2')).next_cursor, 'string', 'the jobs list pages');
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
  const id = failures.items[0]?.id || seen.manual;
  await go(`#/runs/${encodeURIComponent(id)}`);
  await until('the run page', async () => (await page.locator('.run-id').textContent()) === id);
  await sleep(300);
  await shoot('run.png');
});

step('a new job is created from the console, the server\'s objections shown at the field they name', async () => {
  await go('#/jobs');
  await page.click('#new-job');
  await page.locator('#job-editor').waitFor();
  const template = JSON.parse(await page.inputValue('#job-definition'));
  assert.ok(template.schedule && template.http && template.http.url, `the template: ${JSON.stringify(template)}`);
  await page.fill('#job-name', MANAGED);
  // Not JSON: said at once, before any request.
  await page.fill('#job-definition', '{"schedule": ');
  await page.click('#editor-submit');
  const definitionError = page.locator('#job-definition-error');
  await until('the parse error', () => definitionError.isVisible());
  assert.match(await definitionError.textContent(), /^Not JSON: /);
  // The server's word on a key: next to the definition, that key's line selected.
  await page.fill('#job-definition', JSON.stringify({ ...DEFINITION, schedule: 'every now and then' }, null, 2));
  await page.click('#editor-submit');
  await until('the server\'s word on the schedule', async () => (await definitionError.getAttribute('data-param')) === 'schedule');
  assert.match(await definitionError.textContent(), /^schedule: /);
  assert.equal(await page.getAttribute('#job-definition', 'aria-invalid'), 'true');
  const selected = await page.$eval('#job-definition', (t) => [document.activeElement === t, t.value.slice(t.selectionStart, t.selectionEnd)]);
  assert.deepEqual(selected, [true, '  "schedule": "every now and then",'], 'the schedule\'s line is not focused and selected');
  // The server's word on the name: next to the name.
  await page.fill('#job-name', 'e2e managed');
  await page.fill('#job-definition', JSON.stringify(DEFINITION, null, 2));
  await page.click('#editor-submit');
  const nameError = page.locator('#job-name-error');
  await until('the server\'s word on the name', () => nameError.isVisible());
  assert.equal(await nameError.getAttribute('data-param'), 'job');
  assert.match(await nameError.textContent(), /contains a space/);
  assert.ok(await definitionError.isHidden(), 'the schedule\'s error stayed after it was fixed');
  await page.fill('#job-name', MANAGED);
  await page.click('#editor-submit');
  const revision = await flashedRevision(`Created ${MANAGED}`);
  await until(`${MANAGED}'s page`, async () => (await page.locator('.job h1').textContent()) === MANAGED);
  const job = await managed(MANAGED);
  assert.equal(job.managed.revision, revision);
  assert.deepEqual(job.definition, DEFINITION);
  seen.created = revision;
  // Creating never replaces: the same name again is refused at the name.
  await go('#/new-job');
  await page.locator('#job-editor').waitFor();
  await page.fill('#job-name', MANAGED);
  await page.click('#editor-submit');
  await until('the name taken', () => nameError.isVisible());
  assert.match(await nameError.textContent(), new RegExp(`A managed job named ${MANAGED} exists already \\(revision ${revision}\\)`));
  assert.equal((await managed(MANAGED)).managed.revision, revision, 'a second creation replaced the job');
});

step('the managed job is listed; its page shows its definition, revision, author and revisions', async () => {
  await search(MANAGED);
  assert.match(await row(MANAGED).locator('[data-badge="managed"]').textContent(), new RegExp(`Managed · rev ${seen.created}$`));
  await row(MANAGED).locator('a.job-name').click();
  await until('the definition on its page', () => page.locator('#definition').isVisible());
  assert.deepEqual(JSON.parse(await page.textContent('#definition')), DEFINITION);
  assert.equal(await page.textContent('[data-field="revision"]'), String(seen.created));
  assert.equal(await page.textContent('[data-field="changed-by"]'), 'ops');
  const revisions = page.locator('.revisions tbody tr');
  assert.equal(await revisions.count(), 1);
  assert.equal(await revisions.first().getAttribute('data-change'), 'created');
  assert.match(await revisions.first().textContent(), /\+ created\s*ops/);
  await page.locator('.job .head button[data-action="edit"]').waitFor();
  await page.locator('.job .head button[data-action="delete"]').waitFor();
});

step('a declared job says where it is declared, and offers no edit', async () => {
  await openJob('stuck');
  await until('where stuck is declared', () => page.locator('#declared-in').isVisible());
  assert.match(await page.textContent('#declared-in'), /^Declared in \/tmp\/solocron-e2e\.\w+\/solocron\.toml: read-only here/);
  assert.equal(await page.locator('[data-action="edit"], [data-action="delete"]').count(), 0);
  await go('#/jobs/stuck/edit');
  await until('the editor\'s refusal', () => page.locator('#editor-refused').isVisible());
  assert.match(await page.textContent('#editor-refused'), /cannot be edited here\. It is declared in /);
  assert.equal(await page.locator('#job-editor').count(), 0);
});

step('an edit shows the diff, is saved only once confirmed, and is a new revision', async () => {
  await openJob(MANAGED);
  await page.click('.job .head button[data-action="edit"]');
  await editDefinition((t) => t.replace('*/5 * * * * *', '*/7 * * * * *'));
  assert.equal(await page.getAttribute('#editor-meta', 'data-revision'), String(seen.created));
  await page.keyboard.press('Control+Enter'); // the review, from the keyboard
  const review = page.locator('#job-review');
  await until('the diff', () => review.isVisible());
  const lines = async (tag) => (await review.locator(`pre.diff ${tag}`).allTextContents()).map((l) => l.trimEnd());
  assert.deepEqual(await lines('del'), ['-   "schedule": "*/5 * * * * *"']);
  assert.deepEqual(await lines('ins'), ['+   "schedule": "*/7 * * * * *"']);
  assert.equal(await review.locator('.diff-sum').textContent(), '1 line removed (−), 1 line added (+)');
  assert.ok(await page.$eval('#job-definition', (t) => t.readOnly), 'the text can change under the diff shown');
  assert.equal((await managed(MANAGED)).managed.revision, seen.created, 'saved before it was confirmed');
  await shoot('job-editor.png', EDITOR_SHOT_HEIGHT);
  await page.click('#review-save');
  const revision = await flashedRevision(`Saved ${MANAGED}`);
  assert.ok(revision > seen.created, `revision ${revision} after ${seen.created}`);
  await until('the new revision on the job page', async () => (await page.locator('[data-field="revision"]').textContent()) === String(revision));
  assert.equal(JSON.parse(await page.textContent('#definition')).schedule, '*/7 * * * * *');
  const rows = page.locator('.revisions tbody tr');
  assert.deepEqual(await rows.evaluateAll((rs) => rs.map((r) => [r.dataset.revision, r.dataset.change])),
    [[String(revision), 'changed'], [String(seen.created), 'created']]);
  // What changed, unfolded, stays open across the page's reads: the page reads again only
  // after drawing what it read, so the second read asked for follows a redraw.
  let reads = 0;
  const count = (r) => { if (r.url().includes(`/api/v1/jobs/${MANAGED}/revisions`)) reads += 1; };
  page.on('request', count);
  await rows.first().locator('summary').click();
  await until('two more reads of the page', async () => reads >= 2);
  page.off('request', count);
  assert.ok(await rows.first().locator('details').evaluate((d) => d.open), 'the unfolded change folded at a redraw');
  assert.deepEqual(await rows.first().locator('del').allTextContents(), ['-   "schedule": "*/5 * * * * *"\n']);
  seen.edited = revision;
});

step('a stale edit is refused (409), says so, and offers the newest version', async () => {
  await page.click('.job .head button[data-action="edit"]');
  await editDefinition((t) => t.replace('"2s"', '"3s"'));
  // Meanwhile, someone else changes the job through the API.
  const theirs = { ...DEFINITION, schedule: '*/7 * * * * *', lease: '45s' };
  const put = await http(`/api/v1/jobs/${MANAGED}`, { token: OPS, method: 'PUT', body: theirs, ifMatch: seen.edited });
  assert.equal(put.status, 200, put.text);
  const theirRevision = JSON.parse(put.text).revision;
  await page.click('#editor-submit');
  await page.click('#review-save');
  const conflict = page.locator('#conflict');
  await until('the conflict', () => conflict.isVisible());
  assert.match(await conflict.textContent(), new RegExp(`someone changed this job since you opened it\\. You edited revision ${seen.edited}`));
  const now = await managed(MANAGED);
  assert.equal(now.managed.revision, theirRevision, 'the stale edit was written');
  assert.deepEqual(now.definition, theirs);
  await page.click('#editor-reload');
  await until('the newest version in the editor', async () => (await page.getAttribute('#editor-meta', 'data-revision')) === String(theirRevision));
  assert.deepEqual(JSON.parse(await page.inputValue('#job-definition')), theirs);
  assert.match(await page.textContent('#unsaved pre'), /"timeout": "3s"/);
  seen.theirs = theirRevision;
});

step('trigger, pause and resume keep working on a managed job', async () => {
  await openJob(MANAGED);
  const head = page.locator('.job .head');
  await head.locator('button[data-action="trigger"]').click();
  await confirm('e2e: managed run');
  const link = page.locator('#flash-run');
  await until('the flash naming the requested run', () => link.isVisible());
  const id = await link.getAttribute('data-run-id');
  const run = await until(`run ${id} to fail on the refused connection`, async () => {
    const r = (await api(`/api/v1/runs/${encodeURIComponent(id)}`)).run;
    return r.state === 'failed' && r;
  });
  assert.equal(run.trigger, 'manual');
  assert.match(run.reason, /127\.0\.0\.1:9/);
  await head.locator('button[data-action="pause"]').click();
  await confirm('e2e: managed pause');
  const badge = head.locator('[data-badge="paused"]');
  await until('the paused badge', () => badge.isVisible());
  await head.locator('button[data-action="resume"]').click();
  await confirm();
  await until('the paused badge to go', async () => (await badge.count()) === 0);
});

step('deleting asks first; the job is then no longer managed', async () => {
  const head = page.locator('.job .head');
  await head.locator('button[data-action="delete"]').click();
  assert.equal(await page.textContent('#confirm-title'), `Delete ${MANAGED}?`);
  assert.match(await page.textContent('#confirm-text'), new RegExp(`a run in progress finishes.*revision ${seen.theirs}`));
  assert.ok(await page.locator('#confirm-reason-box').isHidden(), 'a delete asks for a reason the API does not take');
  await page.click('#confirm-cancel');
  assert.equal((await managed(MANAGED)).managed.revision, seen.theirs, 'deleted without confirmation');
  await head.locator('button[data-action="delete"]').click();
  await confirm();
  const revision = await flashedRevision(`Deleted ${MANAGED}`);
  await until('the deletion on the job page', () => page.locator('#deleted-note').isVisible());
  assert.match(await page.textContent('#deleted-note'), new RegExp(`Deleted by ops .*\\(revision ${revision}\\)`));
  const first = page.locator('.revisions tbody tr').first();
  assert.equal(await first.getAttribute('data-change'), 'deleted');
  assert.equal(await first.getAttribute('data-revision'), String(revision));
  assert.equal(await page.locator('[data-action="edit"], [data-action="delete"], #definition').count(), 0);
  assert.equal((await managed(MANAGED)).managed, null);
  // The list keeps no managed job of that name (a node's registration may still list it).
  await go(`#/jobs?search=${MANAGED}`);
  await until('the search answered', async () => /match$/.test(await page.textContent('#jobs-count')));
  assert.equal(await page.locator('[data-badge="managed"]').count(), 0);
});

step('signed in with the read token, no action button is shown anywhere', async () => {
  const put = await http('/api/v1/jobs/e2e-read-only', { token: OPS, method: 'PUT', body: DEFINITION });
  assert.equal(put.status, 200, put.text);
  await page.click('#sign-out');
  await page.waitForSelector('#token');
  await signIn(VIEW);
  await until('the read role in the header', async () => (await page.textContent('#who-role')) === 'read');
  await go('#/jobs');
  await until('the job list', async () => (await page.locator('.jobs-table tbody tr').count()) >= 6);
  await noActionButtons('the job list');
  await openJob('e2e-read-only');
  await until('its definition', () => page.locator('#definition').isVisible());
  await noActionButtons('a managed job\'s page');
  for (const hash of ['#/jobs/e2e-read-only/edit', '#/new-job']) {
    await go(hash);
    await until(`the refusal at ${hash}`, () => page.locator('#editor-refused').isVisible());
    assert.match(await page.textContent('#editor-refused'), /may read only/);
    assert.equal(await page.locator('#job-editor').count(), 0, `an editor at ${hash}`);
  }
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
  const write = await http('/api/v1/jobs/e2e-read-only', { token: VIEW, method: 'DELETE' });
  assert.equal(write.status, 403, 'the API must refuse a read token\'s delete');
});

step('no page raised a script error or a policy violation', async () => {
  assert.deepEqual(problems, [], `problems in the page:\n${problems.join('\n')}`);
});
