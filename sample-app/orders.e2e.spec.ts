import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import type pg from 'pg';
import { databaseUrl, freshSchema, sqlClient } from '../test/support/database.js';
import { send, sleep } from '../test/support/http.js';
import { DEFAULT_PAYMENT_PROVIDER_KEY, loadConfig, SampleConfigError, type HttpAdapterName } from './config.js';
import { createSampleApp } from './create-app.js';

const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const AUTH: [string, string] = ['Authorization', 'Bearer demo-key-tenant-a'];
const AUTH_B: [string, string] = ['Authorization', 'Bearer demo-key-tenant-b'];
/** The fake provider's own credential (`PAYMENT_PROVIDER_KEY`), which the app's client sends it. */
const PROVIDER_AUTH: [string, string] = ['Authorization', `Bearer ${DEFAULT_PAYMENT_PROVIDER_KEY}`];

describe.each(ADAPTERS)('sample checkout (phases, derived provider key, outbox receipt) over %s', (adapter) => {
  let app: INestApplication;
  let url: string;
  let db: pg.Client;
  let n = 0;
  const unique = (label: string) => `${label}-${adapter}-${Date.now()}-${++n}`;

  beforeAll(async () => {
    const schema = await freshSchema(`sample_orders_${adapter}`);
    const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: databaseUrl(), IDEMPOTENCY_LEASE_MS: '1000' });
    app = await createSampleApp({ ...config, databaseUrl: databaseUrl(), databaseSchema: schema, logger: false });
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await app?.close();
    await db?.end();
  });

  const checkout = (customer: string, key: string, auth = AUTH) =>
    send(url, 'POST', '/orders/checkout', {
      headers: [auth, ['Idempotency-Key', key]],
      body: { amount: 4200, currency: 'eur', customer, email: `${customer}@example.test` },
    });
  const count = async (sql: string, params: unknown[]) => Number((await db.query(sql, params)).rows[0].count);
  const orders = (customer: string) => count('SELECT count(*) FROM orders WHERE customer = $1', [customer]);
  /** The provider's count of real charges for one merchant account (a tenant), read with the provider's credential. */
  async function providerCharges(account = 'tenant-a'): Promise<number> {
    const res = await send(url, 'GET', '/provider/stats', { headers: [PROVIDER_AUTH, ['Provider-Account', account]] });
    expect(res.status).toBe(200);
    expect(res.json()).toEqual({ account, charges: expect.any(Number) });
    return res.json().charges as number;
  }
  const setOutage = (on: boolean) => send(url, 'POST', '/provider/outage', { headers: [PROVIDER_AUTH], body: { on } });
  const receiptsFor = (customer: string) =>
    count('SELECT count(*) FROM receipt_deliveries r JOIN orders o ON o.id = r.order_id WHERE o.customer = $1', [customer]);
  async function waitForReceipt(customer: string): Promise<number> {
    for (let i = 0; i < 40; i++) {
      const delivered = await receiptsFor(customer);
      if (delivered > 0) return delivered;
      await sleep(100);
    }
    return 0;
  }

  it('checks out once: one order, one provider charge, a receipt through the outbox; a retry replays', async () => {
    const customer = unique('cus');
    const chargesBefore = await providerCharges();
    const first = await checkout(customer, `k-${customer}`);
    expect(first.status).toBe(201);
    expect(first.json()).toMatchObject({ object: 'order', status: 'paid', paymentId: expect.stringMatching(/^py_/) });
    const retry = await checkout(customer, `k-${customer}`);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(retry.body, first.body)).toBe(0);
    expect(await orders(customer)).toBe(1);
    expect((await providerCharges()) - chargesBefore).toBe(1);
    expect(await waitForReceipt(customer)).toBeGreaterThanOrEqual(1);
  });

  it('concurrent duplicates of one checkout: one order and one provider charge', async () => {
    const customer = unique('cus');
    const chargesBefore = await providerCharges();
    const answers = await Promise.all(Array.from({ length: 10 }, () => checkout(customer, `k-${customer}`)));
    expect(answers.filter((a) => a.status === 201 && !a.headers['idempotent-replayed'])).toHaveLength(1);
    for (const a of answers) expect([201, 409]).toContain(a.status);
    expect(await orders(customer)).toBe(1);
    expect((await providerCharges()) - chargesBefore).toBe(1);
  });

  it('a provider outage after the order phase: the retry after the lease resumes at the charge, not at the top', async () => {
    const customer = unique('cus');
    const key = `k-${customer}`;
    const chargesBefore = await providerCharges();
    expect((await setOutage(true)).status).toBe(204);
    try {
      const failed = await checkout(customer, key);
      expect(failed.status).toBe(500);
    } finally {
      await setOutage(false);
    }
    const row = (await db.query('SELECT status, recovery_point FROM idempotency_keys WHERE key = $1', [key])).rows[0];
    expect(row).toEqual({ status: 'in_flight', recovery_point: 'create-order' });
    expect(await orders(customer)).toBe(1);
    expect((await checkout(customer, key)).status).toBe(409); // the lease (1 s) still holds
    await sleep(1100);
    const resumed = await checkout(customer, key);
    expect(resumed.status).toBe(201);
    expect(resumed.json()).toMatchObject({ status: 'paid' });
    expect(await orders(customer)).toBe(1);
    expect((await providerCharges()) - chargesBefore).toBe(1);
    expect(await waitForReceipt(customer)).toBeGreaterThanOrEqual(1);
  });

  it('the provider counts charges per merchant account: a checkout of tenant-a counts for tenant-a only', async () => {
    const before = { a: await providerCharges('tenant-a'), b: await providerCharges('tenant-b') };
    const ofA = unique('cus');
    expect((await checkout(ofA, `k-${ofA}`, AUTH)).status).toBe(201);
    expect(await providerCharges('tenant-a')).toBe(before.a + 1);
    expect(await providerCharges('tenant-b')).toBe(before.b);
    const ofB = unique('cus');
    expect((await checkout(ofB, `k-${ofB}`, AUTH_B)).status).toBe(201);
    expect(await providerCharges('tenant-a')).toBe(before.a + 1);
    expect(await providerCharges('tenant-b')).toBe(before.b + 1);
    const accounts = await db.query(
      `SELECT p.account, o.tenant_id FROM provider_charges p JOIN orders o ON o.payment_id = p.id WHERE o.customer = ANY($1)`,
      [[ofA, ofB]],
    );
    expect(accounts.rows.map((r) => [r.account, r.tenant_id]).sort()).toEqual([
      ['tenant-a', 'tenant-a'],
      ['tenant-b', 'tenant-b'],
    ]);
    // Statistics name their account: without one there are none to give.
    const anonymous = await send(url, 'GET', '/provider/stats', { headers: [PROVIDER_AUTH] });
    expect(anonymous.status).toBe(400);
  });

  it.each<[string, Array<[string, string]>]>([
    ['no credential', []],
    ['an API key of the payments API', [AUTH, ['Provider-Account', 'tenant-a']]],
    [
      'a wrong key',
      [
        ['Authorization', 'Bearer not-the-provider-key'],
        ['Provider-Account', 'tenant-a'],
      ],
    ],
    ['another scheme', [['Authorization', `Basic ${Buffer.from(`${DEFAULT_PAYMENT_PROVIDER_KEY}:`).toString('base64')}`]]],
  ])('the fake provider answers 401 to %s, on every route, and changes nothing', async (_case, headers) => {
    const chargesBefore = await providerCharges();
    const stats = await send(url, 'GET', '/provider/stats', { headers });
    expect(stats.status).toBe(401);
    expect(stats.headers['www-authenticate']).toBe('Bearer realm="payment-provider"');
    expect(stats.headers['content-type']).toMatch(/^application\/problem\+json(;|$)/);
    expect(stats.json()).toMatchObject({ type: 'about:blank', title: 'Unauthorized', status: 401 });
    expect(stats.text()).not.toMatch(/charges/);
    const charge = await send(url, 'POST', '/provider/charges', {
      headers: [...headers, ['Idempotency-Key', unique('provider-key')]],
      body: { amount: 100, currency: 'usd' },
    });
    expect(charge.status).toBe(401);
    const outage = await send(url, 'POST', '/provider/outage', { headers, body: { on: true } });
    expect(outage.status).toBe(401);
    expect(await providerCharges()).toBe(chargesBefore);
    // The outage was not switched on: a checkout still charges.
    const customer = unique('cus');
    expect((await checkout(customer, `k-${customer}`)).status).toBe(201);
    expect(await providerCharges()).toBe(chargesBefore + 1);
  });

  it("the provider's credential opens nothing of the payments API", async () => {
    const customer = unique('cus');
    const res = await checkout(customer, `k-${customer}`, PROVIDER_AUTH);
    expect(res.status).toBe(401);
    expect((await send(url, 'GET', '/charges', { headers: [PROVIDER_AUTH] })).status).toBe(401);
    expect(await orders(customer)).toBe(0);
  });

  it.each([
    ['a NUL', '/orders/ord_%00'],
    ['a NUL after a well-formed id', `/orders/ord_${'a'.repeat(24)}%00`],
    ['a malformed id', '/orders/not-an-order'],
  ])('GET /orders/:id with %s (an id that cannot exist) answers 404, never 500', async (_case, path) => {
    const res = await send(url, 'GET', path, { headers: [AUTH] });
    expect(res.status).toBe(404);
    expect(res.json()).toEqual({ statusCode: 404, message: 'No such order.', error: 'Not Found' });
  });
});

describe('sample app configuration of the payment provider', () => {
  it('refuses a PAYMENT_PROVIDER_KEY that is also an API key, naming both variables', () => {
    expect(() => loadConfig({ PAYMENT_PROVIDER_KEY: 'demo-key-tenant-b' })).toThrow(SampleConfigError);
    expect(() => loadConfig({ PAYMENT_PROVIDER_KEY: 'demo-key-tenant-b' })).toThrow(/PAYMENT_PROVIDER_KEY.*SAMPLE_API_KEYS/);
    expect(loadConfig({ PAYMENT_PROVIDER_KEY: 'sk_other' }).paymentProviderKey).toBe('sk_other');
    expect(loadConfig({}).paymentProviderKey).toBe(DEFAULT_PAYMENT_PROVIDER_KEY);
  });
});
