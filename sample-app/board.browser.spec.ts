import { afterAll, beforeAll, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import type pg from 'pg';
import helmet from 'helmet';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { boardKey } from '../src/board/board-key.js';
import { CHROMIUM_PATH, describeEachWithBrowser } from '../test/support/browser.js';
import { databaseUrl, freshSchema, sqlClient } from '../test/support/database.js';
import { send, sleep } from '../test/support/http.js';
import { loadConfig, type HttpAdapterName } from './config.js';
import { createSampleApp } from './create-app.js';

/**
 * The operator board in a real browser (Debian's Chromium, driven by
 * playwright-core), against the sample app as `npm run sample` wires it:
 * mounted at /board behind the sample's API-key guard, each key's holder
 * scoped to its tenant.
 */
const ARTIFACTS = new URL('../test-artifacts/', import.meta.url);
const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const KEY_A = 'demo-key-tenant-a';
const charge = { amount: 1_500, currency: 'usd', customer: 'cus_board' };

const createCharge = (url: string, key: string, body: object = charge) =>
  send(url, 'POST', '/charges', {
    headers: [
      ['Authorization', `Bearer ${KEY_A}`],
      ['Idempotency-Key', key],
    ],
    body,
  });

async function count(page: Page, id: string): Promise<number> {
  return Number(await page.locator(`#${id} .value`).textContent());
}

describeEachWithBrowser(ADAPTERS, 'the operator board in Chromium, sample app over %s', (adapter) => {
  let app: INestApplication;
  let url: string;
  let db: pg.Client;
  let browser: Browser;
  let operator: BrowserContext;
  let page: Page;
  const problems: string[] = [];

  beforeAll(async () => {
    const schema = await freshSchema(`board_browser_${adapter}`);
    // A short lease: the heartbeat (a third of it) soon notices a release on the instance running the attempt.
    const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: databaseUrl(), IDEMPOTENCY_LEASE_MS: '3000' });
    app = await createSampleApp({ ...config, databaseUrl: databaseUrl(), databaseSchema: schema, logger: false });
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
    db = await sqlClient(schema);
    browser = await chromium.launch({
      executablePath: CHROMIUM_PATH,
      args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
    });
    operator = await browser.newContext({
      extraHTTPHeaders: { Authorization: `Bearer ${KEY_A}` },
      viewport: { width: 1200, height: 900 },
    });
    page = await operator.newPage();
    // A policy violation or a script error shows in the console: none may happen.
    page.on('console', (message) => {
      if (message.type() === 'error') problems.push(message.text());
    });
    page.on('pageerror', (error) => problems.push(error.message));
  });
  afterAll(async () => {
    await browser?.close();
    await app?.close();
    await db?.end();
  });

  it('sends a browser without an API key to the sign-in form; a script without one gets 401', async () => {
    const anonymous = await browser.newContext();
    try {
      const response = await (await anonymous.newPage()).goto(`${url}/board`);
      expect(response?.status()).toBe(200);
      expect(response?.url()).toBe(`${url}/board/login`);
      expect((await send(url, 'GET', '/board')).status).toBe(401);
      expect((await send(url, 'GET', '/board/api/overview', { headers: [['Accept', 'text/html']] })).status).toBe(401);
    } finally {
      await anonymous.close();
    }
  });

  it('signs a plain browser in through the form, the key never in a URL nor in the cookie, and out again', async () => {
    const person = await browser.newContext();
    const seen: string[] = [];
    const urls: string[] = [];
    try {
      const signIn = await person.newPage();
      signIn.on('console', (message) => {
        if (message.type() === 'error') seen.push(message.text());
      });
      signIn.on('pageerror', (error) => seen.push(error.message));
      signIn.on('request', (request) => urls.push(request.url()));
      expect((await createCharge(url, randomUUID())).status).toBe(201);
      await signIn.goto(`${url}/board/login`);
      await signIn.fill('#api-key', KEY_A);
      await Promise.all([signIn.waitForURL(`${url}/board`), signIn.click('#login-form button[type=submit]')]);
      // No Authorization header anywhere: the board's counts, scoped to the key's tenant, through the session cookie.
      await signIn.locator('#count-completed .value').waitFor();
      expect(await count(signIn, 'count-completed')).toBeGreaterThan(0);
      expect(await signIn.locator('#tenants tbody tr').allTextContents()).toEqual([expect.stringMatching(/^tenant-a/)]);
      // An action (a POST with the board's anti-forgery token) works under the session too.
      await signIn.fill('#lookup-key', 'no-such-key');
      await signIn.click('#lookup-form button[type=submit]');
      await signIn.locator('#lookup-error', { hasText: 'No such key for this tenant' }).waitFor();

      const cookies = await person.cookies(`${url}/board`);
      const session = cookies.find((cookie) => cookie.name === 'sample_board_session');
      expect(session).toMatchObject({ path: '/board', httpOnly: true, sameSite: 'Strict' });
      expect(session!.value).toMatch(/^[A-Za-z0-9_-]{43}$/);
      for (const cookie of cookies) expect(cookie.value).not.toContain(KEY_A);
      expect(urls.length).toBeGreaterThan(3);
      for (const visited of urls) expect(decodeURIComponent(visited)).not.toContain(KEY_A);
      expect(seen.filter((text) => !/status of 404/.test(text))).toEqual([]);

      // The session stands in for the key on the board's routes only.
      const cookie: [string, string] = ['Cookie', `sample_board_session=${session!.value}`];
      expect((await send(url, 'GET', '/board/api/overview', { headers: [cookie] })).status).toBe(200);
      expect((await send(url, 'GET', '/charges', { headers: [cookie] })).status).toBe(401);
      // An Authorization header, when sent, decides alone.
      const wrongHeader = await send(url, 'GET', '/board/api/overview', { headers: [cookie, ['Authorization', 'Bearer nope']] });
      expect(wrongHeader.status).toBe(401);

      await signIn.goto(`${url}/board/login`);
      expect(await signIn.locator('#signed-in').textContent()).toContain('tenant-a');
      await Promise.all([signIn.waitForURL(`${url}/board/login`), signIn.click('#logout-form button[type=submit]')]);
      expect((await person.cookies(`${url}/board`)).find((c) => c.name === 'sample_board_session')).toBeUndefined();
      expect((await send(url, 'GET', '/board/api/overview', { headers: [cookie] })).status).toBe(401);
      const again = await signIn.goto(`${url}/board`);
      expect(again?.url()).toBe(`${url}/board/login`);
    } finally {
      await person.close();
    }
  });

  it('answers a wrong key with the form again, an error and no cookie', async () => {
    const person = await browser.newContext();
    try {
      const signIn = await person.newPage();
      await signIn.goto(`${url}/board/login`);
      await signIn.fill('#api-key', 'not-a-key');
      const [response] = await Promise.all([
        signIn.waitForResponse((r) => r.request().method() === 'POST'),
        signIn.click('#login-form button[type=submit]'),
      ]);
      expect(response.status()).toBe(401);
      expect(response.headers()['set-cookie']).toBeUndefined();
      await signIn.locator('#login-error', { hasText: 'not valid' }).waitFor();
      expect(signIn.url()).toBe(`${url}/board/login`);
      await signIn.locator('#login-form').waitFor();
      expect(await person.cookies(`${url}/board`)).toEqual([]);
    } finally {
      await person.close();
    }
  });

  it("refuses a sign-in another site's page posts", async () => {
    const forged = await send(url, 'POST', '/board/login', {
      headers: [
        ['Content-Type', 'application/x-www-form-urlencoded'],
        ['Sec-Fetch-Site', 'cross-site'],
      ],
      rawBody: `apiKey=${KEY_A}`,
    });
    expect(forged.status).toBe(403);
    expect(forged.headers['set-cookie']).toBeUndefined();
    const plain = await send(url, 'POST', '/board/login', {
      headers: [['Content-Type', 'application/x-www-form-urlencoded']],
      rawBody: `apiKey=${KEY_A}`,
    });
    expect(plain.status).toBe(303);
    expect(plain.headers.location).toBe('/board');
    expect(String(plain.headers['set-cookie'])).not.toContain(KEY_A);
  });

  it('shows counts that change after requests, and the outcome chart', async () => {
    await page.goto(`${url}/board`);
    await page.locator('#count-completed').waitFor();
    const completedBefore = await count(page, 'count-completed');
    const key = randomUUID();
    expect((await createCharge(url, key)).status).toBe(201);
    expect((await createCharge(url, key)).headers['idempotent-replayed']).toBe('true');
    expect((await createCharge(url, randomUUID())).status).toBe(201);
    await page.click('#refresh');
    // A function, not a string: the board's policy forbids the eval a string predicate needs.
    await page.waitForFunction(
      (n) =>
        Number(
          (
            globalThis as unknown as { document: { querySelector(s: string): { textContent: string } | null } }
          ).document.querySelector('#count-completed .value')?.textContent,
        ) === n,
      completedBefore + 2,
    );
    expect(await page.locator('#tenants tbody tr').allTextContents()).toEqual([expect.stringMatching(/^tenant-a/)]);
    expect(await page.locator('#outcome-chart rect.bar.executed').count()).toBeGreaterThan(0);
    expect(await page.locator('#outcome-chart rect.bar.replayed').count()).toBeGreaterThan(0);
    // What a request names, the handler as a detail beneath it.
    const route = page.locator('#routes tbody td.route', { hasText: 'ChargesController.create' });
    expect(await route.textContent()).toBe('POST /chargesChargesController.create');
    expect(await route.locator('.handler').textContent()).toBe('ChargesController.create');
    expect(problems).toEqual([]);
  });

  it("names a handler's 500 (5xx, key kept) in the chart, its legend and the routes table", async () => {
    const failed = await createCharge(url, randomUUID(), { ...charge, simulate: { outcome: 'error' } });
    expect(failed.status).toBe(500);
    await page.goto(`${url}/board`);
    await page.locator('#outcome-chart rect.bar.kept').first().waitFor();
    expect(await page.locator('#legend').textContent()).toContain('5xx, key kept');
    expect(await page.locator('#legend').textContent()).not.toMatch(/\bother\b/);
    const headers = await page.locator('#routes thead th').allTextContents();
    const row = await page.locator('#routes tbody tr', { hasText: 'ChargesController.create' }).locator('td').allTextContents();
    expect(row[headers.indexOf('5xx, key kept')]).toMatch(/^[1-9]\d*$/);
    expect(problems).toEqual([]);
  });

  it('shows a stuck key, and releases it after a confirmation: the retry then runs', async () => {
    const key = randomUUID();
    const customer = `cus_stuck_${adapter}`;
    const slow = { ...charge, customer, simulate: { delayMs: 6_000 } };
    const original = createCharge(url, key, slow);
    await sleep(300);
    await page.click('#refresh');
    const row = page.locator('#stuck-keys tr.stuck', { hasText: boardKey(key) });
    await row.waitFor();
    expect(await page.locator('#stuck-keys').textContent()).not.toContain(key);
    expect((await createCharge(url, key, slow)).status).toBe(409);

    await row.locator('button.release').click();
    await page.locator('#confirm[open]').waitFor();
    const confirmation = await page.locator('#confirm-text').textContent();
    expect(confirmation).toMatch(/next retry takes the key over/);
    // The key being released, as the list names it: never the whole key, but never one another key could share.
    expect(confirmation).toContain(`Release key ${boardKey(key)} of tenant tenant-a?`);
    await page.click('#confirm-ok');
    await page.locator('#toast', { hasText: 'Released' }).waitFor();

    // Within a heartbeat the retry takes the key over and runs (its own 6 s); the released attempt is fenced.
    let retry = await createCharge(url, key, slow);
    for (let i = 0; retry.status === 409 && i < 30; i++) {
      await sleep(100);
      retry = await createCharge(url, key, slow);
    }
    expect(retry.status).toBe(201);
    expect((await original).status).toBe(409);
    // One charge: the released attempt's insert rolled back with its fenced completion.
    const charges = await db.query('SELECT id FROM charges WHERE customer = $1', [customer]);
    expect(charges.rows).toEqual([{ id: retry.json().id }]);
    const keyRow = await db.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key]);
    expect(keyRow.rows[0]).toEqual({ status: 'completed', attempt: 2 });
    expect(problems).toEqual([]);
  });

  it('finds a key with the lookup', async () => {
    const key = randomUUID();
    expect((await createCharge(url, key)).status).toBe(201);
    await page.goto(`${url}/board#lookup`);
    expect(await page.inputValue('#lookup-tenant')).toBe('tenant-a');
    await page.fill('#lookup-key', key);
    await page.click('#lookup-form button[type=submit]');
    const details = page.locator('#lookup-details');
    await details.waitFor();
    const text = await details.textContent();
    expect(text).toContain('Statecompleted');
    expect(text).toContain('Stored status201');
    // Shown back as typed to the operator who typed it, and as the lists name it; a completed key has no lease.
    expect(text).toContain(`Key${key}Listed as${boardKey(key)}`);
    expect(text).not.toMatch(/Lease end/);
    expect(problems).toEqual([]);
    await page.fill('#lookup-key', 'no-such-key');
    await page.click('#lookup-form button[type=submit]');
    await page.locator('#lookup-error', { hasText: 'No such key for this tenant' }).waitFor();
    // The browser logs the lookup's 404 answer itself; nothing else.
    expect(problems).toEqual([expect.stringMatching(/status of 404/)]);
    problems.length = 0;
  });

  it('redrives a dead letter, which the relay then delivers', async () => {
    const orderId = randomUUID();
    const { rows } = await db.query(
      `INSERT INTO outbox_messages (tenant_id, topic, payload, status, attempts, last_error)
       VALUES ('tenant-a', 'receipt.email', $1, 'dead', 5, 'mailbox unavailable') RETURNING id`,
      [JSON.stringify({ orderId, email: 'board@example.com', amount: 100 })],
    );
    const id = String(rows[0].id);
    await page.goto(`${url}/board#dead`);
    const row = page.locator('#dead-letters tr.dead-letter', { hasText: 'mailbox unavailable' });
    await row.waitFor();
    await row.locator('button.redrive').click();
    expect(await page.locator('#confirm-text').textContent()).toContain(`message ${id}`);
    await page.click('#confirm-ok');
    await page.locator('#toast', { hasText: 'Redriven: 1.' }).waitFor();
    // The relay records the delivery, then settles the message: wait for the settlement, not only the delivery.
    const status = async () => (await db.query(`SELECT status FROM outbox_messages WHERE id = $1`, [id])).rows[0].status;
    for (let i = 0; i < 50 && (await status()) !== 'delivered'; i++) await sleep(100);
    expect((await db.query('SELECT 1 FROM receipt_deliveries WHERE message_id = $1', [id])).rowCount).toBe(1);
    expect(await status()).toBe('delivered');
    expect(problems).toEqual([]);
  });

  it("works under helmet's default Content-Security-Policy in place of the board's own", async () => {
    const directives = helmet.contentSecurityPolicy.getDefaultDirectives();
    const helmetPolicy = Object.entries(directives)
      .map(([name, values]) => [name, ...[...(values as Iterable<string>)]].join(' '))
      .join('; ');
    const underHelmet = await browser.newContext({ extraHTTPHeaders: { Authorization: `Bearer ${KEY_A}` } });
    const seen: string[] = [];
    try {
      // Every answer of the board reaches the page with helmet's policy instead of the board's.
      await underHelmet.route(`${url}/board**`, async (route) => {
        const response = await route.fetch();
        await route.fulfill({ response, headers: { ...response.headers(), 'content-security-policy': helmetPolicy } });
      });
      const helmeted = await underHelmet.newPage();
      helmeted.on('console', (message) => {
        if (message.type() === 'error') seen.push(message.text());
      });
      helmeted.on('pageerror', (error) => seen.push(error.message));
      expect((await createCharge(url, randomUUID())).status).toBe(201);
      const response = await helmeted.goto(`${url}/board`);
      expect(response?.headers()['content-security-policy']).toBe(helmetPolicy);
      await helmeted.locator('#count-completed').waitFor();
      await helmeted.locator('#outcome-chart rect.bar').first().waitFor();
      await helmeted.click('#refresh');
      await helmeted.locator('#updated', { hasText: 'Updated' }).waitFor();
      expect(seen).toEqual([]);
    } finally {
      // The page may still be refreshing through the route: let those requests go, then close.
      await underHelmet.unrouteAll({ behavior: 'ignoreErrors' });
      await underHelmet.close();
    }
  });

  it('keeps a screenshot of the overview', async () => {
    await page.goto(`${url}/board`);
    await page.locator('#count-completed').waitFor();
    await page.locator('#outcome-chart').waitFor();
    await mkdir(ARTIFACTS, { recursive: true });
    const path = new URL(`board-overview-${adapter}.png`, ARTIFACTS);
    const image = await page.screenshot({ path: path.pathname, fullPage: true });
    expect(image.length).toBeGreaterThan(10_000);
    expect(problems).toEqual([]);
  });
});
