import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { HttpAdapterName } from '../../sample-app/config.js';
import { businessKey, IdempotentClient, OutcomeUnknownError, type IdempotentResponse } from '../../src/client/index.js';
import { LossyProxy } from '../reliability/support/lossy-proxy.js';
import { API_KEY, startSampleApi, type SampleApi } from './support/sample-api.js';

const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const INTENTS = 24;
const DROP_RATE = 0.3;
const CONCURRENCY = 4;

interface Charge {
  id: string;
  customer: string;
}

/** Runs `work` over `items` with `concurrency` workers; results in item order. */
async function eachConcurrently<T, R>(items: T[], concurrency: number, work: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < items.length; i = next++) results[i] = await work(items[i]);
    }),
  );
  return results;
}

describe.each(ADAPTERS)('the client against the sample payments API over %s', (adapter) => {
  let api: SampleApi;
  const run = `${adapter}-${Date.now()}`;
  const chargeBody = (customer: string, simulate?: Record<string, unknown>) => ({
    amount: 4200,
    currency: 'eur',
    customer,
    ...(simulate ? { simulate } : {}),
  });

  beforeAll(async () => {
    // A short lease, so an intent that meets its own earlier attempt in flight waits ~2 s, not 30.
    api = await startSampleApi(adapter, 'client_charges', { IDEMPOTENCY_LEASE_MS: '2000' });
  });
  afterAll(async () => {
    await api?.close();
  });

  it(`${INTENTS} intents through a network that loses ${DROP_RATE * 100} % of answers after the server acted: ${INTENTS} charges, each final answer naming its own`, async () => {
    const proxy = new LossyProxy(api.port, DROP_RATE, adapter === 'express' ? 14_001 : 14_002);
    await proxy.start();
    try {
      const client = new IdempotentClient({
        baseUrl: `http://127.0.0.1:${proxy.port}`,
        // One exchange per connection, so the proxy decides per request.
        headers: { authorization: `Bearer ${API_KEY}`, connection: 'close' },
        maxAttempts: 10,
        initialDelay: 20,
        maxDelay: 200,
        // This test is about the lost answers; the budget has a test of its own.
        budget: { minRetries: 1_000 },
      });
      const customers = Array.from({ length: INTENTS }, (_, i) => `cus-lossy-${run}-${i}`);
      const finals = await eachConcurrently(customers, CONCURRENCY, (customer) => client.post('/charges', chargeBody(customer)));

      const charges = await api.chargesByCustomer();
      customers.forEach((customer, i) => {
        const final = finals[i];
        const answer = final.json<Charge>();
        expect({ customer, status: final.status, answerFor: answer.customer }).toEqual({
          customer,
          status: 201,
          answerFor: customer,
        });
        expect({ customer, charges: charges.get(customer) }).toEqual({ customer, charges: [answer.id] });
        // A retry happens only after a lost answer, whose effect had happened: the final answer is then a replay.
        expect({ customer, replayed: final.replayed }).toEqual({ customer, replayed: final.attempts > 1 });
      });
      const retries = finals.reduce((sum, final) => sum + final.attempts - 1, 0);
      expect(proxy.stats.dropped).toBeGreaterThan(0);
      expect(retries).toBe(proxy.stats.dropped);
      expect(proxy.stats.connections).toBe(INTENTS + retries);
    } finally {
      await proxy.stop();
    }
  });

  it('the wrong pattern, a new key minted inside the retry loop, charges again for every lost answer', async () => {
    const proxy = new LossyProxy(api.port, DROP_RATE, adapter === 'express' ? 14_001 : 14_002);
    await proxy.start();
    try {
      const customers = Array.from({ length: INTENTS }, (_, i) => `cus-wrong-${run}-${i}`);
      /** What the client exists to prevent: each attempt is, to the server, a new operation. */
      const naiveCharge = async (customer: string): Promise<number> => {
        for (let attempt = 1; ; attempt++) {
          try {
            const response = await fetch(`http://127.0.0.1:${proxy.port}/charges`, {
              method: 'POST',
              headers: {
                authorization: `Bearer ${API_KEY}`,
                connection: 'close',
                'content-type': 'application/json',
                'idempotency-key': randomUUID(),
              },
              body: JSON.stringify(chargeBody(customer)),
            });
            await response.arrayBuffer();
            return attempt;
          } catch {
            // The answer was lost; retry, with (wrongly) a fresh key.
          }
        }
      };
      const attempts = await eachConcurrently(customers, CONCURRENCY, naiveCharge);

      const charges = await api.chargesByCustomer();
      const perCustomer = customers.map((customer) => charges.get(customer)?.length ?? 0);
      // Every attempt was executed: one charge per attempt, not per intent.
      expect(perCustomer).toEqual(attempts);
      expect(proxy.stats.dropped).toBeGreaterThan(0);
      const total = perCustomer.reduce((a, b) => a + b, 0);
      expect(total).toBe(INTENTS + proxy.stats.dropped);
      expect(perCustomer.filter((count) => count > 1).length).toBeGreaterThan(0);
    } finally {
      await proxy.stop();
    }
  });

  describe('a batch job restarted mid-way', () => {
    const ITEMS = 8;
    const CRASH_AT = 4;
    /** The item whose request is in flight when the first run dies: the sample's processor takes 300 ms on it. */
    const body = (job: string, item: number) =>
      chargeBody(`cus-${job}-${item}`, item === CRASH_AT ? { delayMs: 300 } : undefined);

    /**
     * One run of the job: charges items in order, each with `keyFor(item)`.
     * With `crash`, the run dies while item CRASH_AT's request is in flight,
     * as a killed process would: its answer never arrives.
     */
    async function runJob(job: string, keyFor: (item: number) => string, crash: boolean): Promise<IdempotentResponse[]> {
      // A new client per run, as a restarted process would have.
      const client = new IdempotentClient({ baseUrl: api.url, headers: { authorization: `Bearer ${API_KEY}` } });
      const answers: IdempotentResponse[] = [];
      for (let item = 0; item < ITEMS; item++) {
        const dies = crash && item === CRASH_AT ? AbortSignal.timeout(100) : undefined;
        try {
          answers.push(await client.post('/charges', body(job, item), { key: keyFor(item), signal: dies }));
        } catch (error) {
          if (!(error instanceof OutcomeUnknownError) || !dies) throw error;
          return answers;
        }
      }
      return answers;
    }

    async function chargesPerItem(job: string): Promise<number[]> {
      const charges = await api.chargesByCustomer();
      return Array.from({ length: ITEMS }, (_, item) => charges.get(`cus-${job}-${item}`)?.length ?? 0);
    }

    it('with keys from business identity makes one charge per item, the restart replaying what the first run did', async () => {
      const job = `job-business-${run}`;
      const keyFor = (item: number) => businessKey('payout-run', job, 'item', item);
      const first = await runJob(job, keyFor, true);
      expect(first).toHaveLength(CRASH_AT);
      const second = await runJob(job, keyFor, false);

      expect(await chargesPerItem(job)).toEqual(Array(ITEMS).fill(1));
      expect(second.map((answer) => answer.status)).toEqual(Array(ITEMS).fill(201));
      // Items the first run finished are replays; the one it died on was done by then (a replay) or still in flight
      // (a 409, waited out, then a replay); the rest are new.
      expect(second.map((answer) => answer.replayed)).toEqual([
        ...Array(CRASH_AT + 1).fill(true),
        ...Array(ITEMS - CRASH_AT - 1).fill(false),
      ]);
      for (let item = 0; item < CRASH_AT; item++) expect(second[item].json<Charge>().id).toBe(first[item].json<Charge>().id);
    });

    it('with keys minted per run (the wrong pattern) charges twice every item the first run reached', async () => {
      const job = `job-random-${run}`;
      const keys = () => {
        const minted = Array.from({ length: ITEMS }, () => randomUUID());
        return (item: number) => minted[item];
      };
      await runJob(job, keys(), true);
      await runJob(job, keys(), false);
      // The first run's last request is still being served after its client died; let it land before counting.
      const expected = [...Array(CRASH_AT + 1).fill(2), ...Array(ITEMS - CRASH_AT - 1).fill(1)];
      for (const until = Date.now() + 5_000; Date.now() < until;) {
        if ((await chargesPerItem(job))[CRASH_AT] >= 2) break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }

      expect(await chargesPerItem(job)).toEqual(expected);
    });
  });

  it('does not retry a 500 from the handler (the key stays in flight until its lease ends): one attempt, the 500 returned', async () => {
    const client = new IdempotentClient({ baseUrl: api.url, headers: { authorization: `Bearer ${API_KEY}` } });
    const customer = `cus-error-${run}`;
    const answer = await client.post('/charges', chargeBody(customer, { outcome: 'network' }));
    expect(answer).toMatchObject({ status: 500, attempts: 1, replayed: false, gaveUp: undefined });
    // The same key a moment later meets the held key: a 409 with Retry-After, which the client does wait out.
    const again = await new IdempotentClient({
      baseUrl: api.url,
      headers: { authorization: `Bearer ${API_KEY}` },
      deadline: 500,
    }).post('/charges', chargeBody(customer, { outcome: 'network' }), { key: answer.key });
    expect(again).toMatchObject({ status: 409, gaveUp: 'deadline' });
    expect(Number(again.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
  });

  it('does not retry a 400 (the body failed validation) nor a 422 (the key was used for another request)', async () => {
    const client = new IdempotentClient({ baseUrl: api.url, headers: { authorization: `Bearer ${API_KEY}` } });
    const invalid = await client.post('/charges', { amount: -1, currency: 'eur', customer: 'x' });
    expect(invalid).toMatchObject({ status: 400, attempts: 1 });
    const key = `reuse-${run}`;
    expect(await client.post('/charges', chargeBody(`cus-a-${run}`), { key })).toMatchObject({ status: 201 });
    const mismatch = await client.post('/charges', chargeBody(`cus-b-${run}`), { key });
    expect(mismatch).toMatchObject({ status: 422, attempts: 1 });
  });
});
