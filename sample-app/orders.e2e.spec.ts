import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import type pg from 'pg';
import { databaseUrl, freshSchema, sqlClient } from '../test/support/database.js';
import { send, sleep } from '../test/support/http.js';
import { loadConfig, type HttpAdapterName } from './config.js';
import { createSampleApp } from './create-app.js';

const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const AUTH: [string, string] = ['Authorization', 'Bearer demo-key-tenant-a'];

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

  const checkout = (customer: string, key: string) =>
    send(url, 'POST', '/orders/checkout', {
      headers: [AUTH, ['Idempotency-Key', key]],
      body: { amount: 4200, currency: 'eur', customer, email: `${customer}@example.test` },
    });
  const count = async (sql: string, params: unknown[]) => Number((await db.query(sql, params)).rows[0].count);
  const orders = (customer: string) => count('SELECT count(*) FROM orders WHERE customer = $1', [customer]);
  const providerCharges = async () => (await send(url, 'GET', '/provider/stats')).json().charges as number;
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
    expect((await send(url, 'POST', '/provider/outage', { body: { on: true } })).status).toBe(204);
    try {
      const failed = await checkout(customer, key);
      expect(failed.status).toBe(500);
    } finally {
      await send(url, 'POST', '/provider/outage', { body: { on: false } });
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
});
