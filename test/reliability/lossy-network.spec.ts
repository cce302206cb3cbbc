import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import got, { type RetryObject } from 'got';
import { Agent } from 'node:http';
import { API_KEY, chargeBody, type ChargeBody } from './support/charges.js';
import { printFigures, tally } from './support/figures.js';
import { LossyProxy } from './support/lossy-proxy.js';
import { Fleet, type AdapterName, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const INTENTS = 40;
const DROP_RATE = 0.3;
const CONCURRENCY = 8;
const RETRY_LIMIT = 10;
const ADAPTERS: AdapterName[] = ['express', 'fastify'];

/**
 * A retrying client as an application would configure one: POST retried on
 * reset connections and on the module's 409/503, waiting what Retry-After
 * says, the same Idempotency-Key on every attempt of one intent.
 */
function retryingClient() {
  return got.extend({
    // One exchange per connection, so the proxy decides per request.
    agent: { http: new Agent({ keepAlive: false }) },
    timeout: { request: 15_000 },
    retry: {
      limit: RETRY_LIMIT,
      methods: ['POST'],
      statusCodes: [409, 503],
      errorCodes: ['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT'],
      calculateDelay: ({ attemptCount, error, computedValue }: RetryObject) => {
        // 0 means got found it not retryable (method, code, status or limit).
        if (computedValue === 0) return 0;
        const retryAfter = Number(error.response?.headers['retry-after']);
        if (Number.isFinite(retryAfter) && retryAfter > 0) return retryAfter * 1_000;
        return Math.min(50 * 2 ** (attemptCount - 1), 800);
      },
    },
  });
}

/**
 * Scenario 5: a network that loses 30% of responses after the server acted,
 * between a real retrying HTTP client (got) and one sample-app process.
 */
describe.each(ADAPTERS)('lossy network over %s', (adapter) => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let app: SampleProcess;
  let proxy: LossyProxy;

  beforeAll(async () => {
    db = await ScenarioDatabase.create(`lossy_${adapter}`);
    app = await fleet.start({ name: `lossy-${adapter}`, adapter, databaseUrl: db.url });
    proxy = new LossyProxy(app.port, DROP_RATE, adapter === 'express' ? 20_260_001 : 20_260_002);
    await proxy.start();
  });
  afterAll(async () => {
    await proxy?.stop();
    await fleet.stopAll();
    await db?.drop();
  });

  it(`${INTENTS} intents through a proxy dropping ${DROP_RATE * 100}% of responses: ${INTENTS} charges, each final answer naming its own`, () =>
    fleet.explain(async () => {
      const client = retryingClient();
      const run = Date.now();
      const intents = Array.from({ length: INTENTS }, (_, i) => ({
        key: `lossy-${adapter}-${run}-${i}`,
        body: chargeBody(`cus-lossy-${adapter}-${run}-${i}`) as ChargeBody,
      }));
      const finals: Array<{ status: number; id: string; replayed: boolean; retries: number }> = [];
      const queue = [...intents];
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let intent = queue.shift(); intent; intent = queue.shift()) {
            const res = await client.post(`http://127.0.0.1:${proxy.port}/charges`, {
              json: intent.body,
              headers: { authorization: `Bearer ${API_KEY}`, 'idempotency-key': intent.key },
              responseType: 'json',
            });
            const body = res.body as { id: string; customer: string };
            expect(body.customer).toBe(intent.body.customer);
            finals[intents.indexOf(intent)] = {
              status: res.statusCode,
              id: body.id,
              replayed: res.headers['idempotent-replayed'] === 'true',
              retries: res.retryCount,
            };
          }
        }),
      );

      const charges = await db.chargesByCustomer();
      intents.forEach((intent, i) => {
        const ids = charges.get(intent.body.customer) ?? [];
        expect({ key: intent.key, charges: ids }).toEqual({ key: intent.key, charges: [finals[i].id] });
        // A retry happens only after a lost response, whose effect had happened: it must be a replay.
        expect({ key: intent.key, replayed: finals[i].replayed }).toEqual({ key: intent.key, replayed: finals[i].retries > 0 });
      });
      const namingOwnCharge = intents.filter((intent, i) => {
        const ids = charges.get(intent.body.customer) ?? [];
        return ids.length === 1 && ids[0] === finals[i].id;
      }).length;
      const retries = finals.reduce((sum, final) => sum + final.retries, 0);
      // Every lost response cost exactly one retry, and the loss really happened.
      expect(retries).toBe(proxy.stats.dropped);
      expect(proxy.stats.dropped).toBeGreaterThan(0);
      expect(proxy.stats.connections).toBe(INTENTS + retries);
      const totalCharges = [...charges.values()].reduce((sum, ids) => sum + ids.length, 0);
      expect(totalCharges).toBe(INTENTS);

      printFigures(`lossy-network/${adapter}`, {
        intents: INTENTS,
        'HTTP attempts': proxy.stats.connections,
        'responses lost after the server acted': proxy.stats.dropped,
        'responses delivered': proxy.stats.forwarded,
        'client retries': retries,
        'final answers': tally(finals.map((final) => `${final.status}${final.replayed ? ' replayed' : ''}`)),
        'final answers naming their own charge': namingOwnCharge,
        charges: totalCharges,
        duplicates: [...charges.values()].filter((ids) => ids.length > 1).length,
      });
    }));
});
