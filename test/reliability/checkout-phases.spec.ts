import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { deriveKey } from '../../src/client/index.js';
import { send, sleep, type RawResponse } from '../support/http.js';
import { printFigures, tally } from './support/figures.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const LEASE_MS = 2_000;
const PHASES = ['create-order', 'charge', 'confirm'] as const;
const AUTH: [string, string] = ['Authorization', 'Bearer demo-key-tenant-a'];

/**
 * Issue 7: a checkout written as phases (order, provider charge with a derived
 * key, receipt through the outbox), its process killed with SIGKILL right
 * after each phase in turn. The retry, on another process once the lease
 * ends, must resume at the recorded phase: one order, one provider charge, at
 * least one receipt.
 */
describe('checkout phases under SIGKILL', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let survivor: SampleProcess;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('checkout_phases');
    survivor = await fleet.start({
      name: 'survivor',
      adapter: 'fastify',
      databaseUrl: db.url,
      env: { IDEMPOTENCY_LEASE_MS: String(LEASE_MS) },
    });
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
  });

  const checkout = (base: string, key: string, customer: string, fault?: string): Promise<RawResponse> =>
    send(base, 'POST', '/orders/checkout', {
      headers: [AUTH, ['Idempotency-Key', key], ...(fault ? ([['X-Fault', fault]] as Array<[string, string]>) : [])],
      body: { amount: 1999, currency: 'usd', customer, email: `${customer}@example.test` },
    });
  const count = async (sql: string, params: unknown[]) => Number((await db.client.query(sql, params)).rows[0].count);

  it.each(PHASES)('killed right after %s: the retry resumes there and every effect happens once', (phase) =>
    fleet.explain(async () => {
      const crasher = await fleet.start({
        name: `crash-after-${phase}`,
        adapter: 'express',
        databaseUrl: db.url,
        env: { IDEMPOTENCY_LEASE_MS: String(LEASE_MS), SAMPLE_FAULT_INJECTION: '1' },
      });
      const customer = `cus-${phase}-${Date.now()}`;
      const key = `checkout-${customer}`;

      const crashed = await checkout(crasher.url, key, customer, `crash-after:${phase}`).then(
        (res) => `answered ${res.status}`,
        (error: Error) => `connection lost (${error.message})`,
      );
      expect(crashed).toMatch(/^connection lost/);
      expect((await crasher.exited).signal).toBe('SIGKILL');
      const row = await db.keyRow(key);
      expect(row).toMatchObject({ status: 'in_flight', recovery_point: phase });
      const ordersAfterCrash = await db.client.query('SELECT id FROM orders WHERE customer = $1', [customer]);
      expect(ordersAfterCrash.rowCount).toBe(1);

      const answers: string[] = [];
      let final: RawResponse | undefined;
      for (let i = 0; i < 40 && !final; i++) {
        const res = await checkout(survivor.url, key, customer);
        answers.push(String(res.status));
        if (res.status === 201) final = res;
        else {
          expect(res.status).toBe(409);
          await sleep(Math.min(Number(res.headers['retry-after'] ?? 1), 1) * 250);
        }
      }
      expect(final).toBeDefined();
      const order = final!.json();
      expect(order).toMatchObject({ id: ordersAfterCrash.rows[0].id, status: 'paid' });

      // The takeover kept the crashed attempt's generation, so it derived the same provider key.
      const generation = (await db.keyRow(key)).generation as string;
      expect(generation).toBe(row.generation);
      const derived = deriveKey({ tenant: 'tenant-a', key, generation }, 'charge', { maxLength: 64 });
      const providerCharges = await count('SELECT count(*) FROM provider_charges WHERE idempotency_key = $1', [derived]);
      const orders = await count('SELECT count(*) FROM orders WHERE customer = $1', [customer]);
      let receipts = 0;
      for (let i = 0; i < 40 && receipts === 0; i++) {
        receipts = await count('SELECT count(*) FROM receipt_deliveries WHERE order_id = $1', [order.id]);
        if (receipts === 0) await sleep(150);
      }
      printFigures(`checkout-crash-after-${phase}`, {
        'answers to retries': tally(answers),
        orders,
        'provider charges': providerCharges,
        'receipts delivered': receipts,
      });
      expect(orders).toBe(1);
      expect(providerCharges).toBe(1);
      expect(order.paymentId).toBe(
        (await db.client.query('SELECT id FROM provider_charges WHERE idempotency_key = $1', [derived])).rows[0].id,
      );
      expect(receipts).toBeGreaterThanOrEqual(1);
    }),
  );
});
