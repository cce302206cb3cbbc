import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { IdempotentClient, type IdempotentResponse } from '../../src/client/index.js';
import { API_KEY, chargeBody } from './support/charges.js';
import { printFigures, tally } from './support/figures.js';
import { LossyProxy } from './support/lossy-proxy.js';
import { Fleet, type AdapterName, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const INTENTS = 60;
const DROP_RATE = 0.3;
const CONCURRENCY = 8;
const ADAPTERS: AdapterName[] = ['express', 'fastify'];

/**
 * The lossy-network scenario (lossy-network.spec.ts drives it with got)
 * driven by this package's own client, against a real sample-app process:
 * 30 % of answers lost after the server acted, the client configured as an
 * application would, its default budget included.
 */
describe.each(ADAPTERS)('the client over a lossy network, sample app on %s', (adapter) => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let app: SampleProcess;
  let proxy: LossyProxy;

  beforeAll(async () => {
    db = await ScenarioDatabase.create(`client_lossy_${adapter}`);
    app = await fleet.start({ name: `client-lossy-${adapter}`, adapter, databaseUrl: db.url });
    proxy = new LossyProxy(app.port, DROP_RATE, adapter === 'express' ? 20_261_401 : 20_261_402);
    await proxy.start();
  });
  afterAll(async () => {
    await proxy?.stop();
    await fleet.stopAll();
    await db?.drop();
  });

  it(`${INTENTS} intents, ${DROP_RATE * 100} % of answers lost: ${INTENTS} charges, each final answer naming its own, retries within the budget`, () =>
    fleet.explain(async () => {
      const client = new IdempotentClient({
        baseUrl: `http://127.0.0.1:${proxy.port}`,
        // One exchange per connection, so the proxy decides per request.
        headers: { authorization: `Bearer ${API_KEY}`, connection: 'close' },
        maxAttempts: 8,
        // A budget that 30 % loss fits in (0.5 x requests): the loss is what is under test, not the budget.
        budget: { ratio: 0.5, minRetries: 10, window: 60_000 },
      });
      const run = Date.now();
      const customers = Array.from({ length: INTENTS }, (_, i) => `cus-client-lossy-${adapter}-${run}-${i}`);
      const finals: IdempotentResponse[] = new Array(INTENTS);
      let next = 0;
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let i = next++; i < INTENTS; i = next++) finals[i] = await client.post('/charges', chargeBody(customers[i]));
        }),
      );

      const charges = await db.chargesByCustomer();
      customers.forEach((customer, i) => {
        const answer = finals[i].json<{ id: string; customer: string }>();
        expect({ customer, status: finals[i].status, for: answer.customer }).toEqual({ customer, status: 201, for: customer });
        expect({ customer, charges: charges.get(customer) }).toEqual({ customer, charges: [answer.id] });
        expect({ customer, replayed: finals[i].replayed }).toEqual({ customer, replayed: finals[i].attempts > 1 });
      });
      const retries = finals.reduce((sum, final) => sum + final.attempts - 1, 0);
      expect(proxy.stats.dropped).toBeGreaterThan(0);
      expect(retries).toBe(proxy.stats.dropped);
      expect(proxy.stats.connections).toBe(INTENTS + retries);
      expect(retries).toBeLessThanOrEqual(10 + 0.5 * INTENTS);

      printFigures(`client/lossy-network/${adapter}`, {
        intents: INTENTS,
        'HTTP attempts': proxy.stats.connections,
        'answers lost after the server acted': proxy.stats.dropped,
        'client retries': retries,
        'final answers': tally(finals.map((final) => `${final.status}${final.replayed ? ' replayed' : ''}`)),
        charges: [...charges.values()].reduce((sum, ids) => sum + ids.length, 0),
        duplicates: [...charges.values()].filter((ids) => ids.length > 1).length,
      });
    }));
});
