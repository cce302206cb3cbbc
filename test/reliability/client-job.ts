/**
 * A batch job as an OS process of its own, for client-restarts.spec.ts: it
 * charges items 0..ITEMS-1 in order through the sample app with the client,
 * one intent per item, and prints one JSON line per answer. The test kills
 * it mid-way (SIGKILL, a request possibly in flight) and starts it again.
 * Started through test/support/run-typescript.mjs. Env: BASE_URL, API_KEY,
 * JOB_ID, ITEMS, DELAY_MS (the sample processor's delay per charge), KEYS
 * (`business`: businessKey('payout', JOB_ID, item), the same on every run;
 * `per-run`: a UUID minted per item per run, the wrong pattern).
 */
import { randomUUID } from 'node:crypto';
import { businessKey, IdempotentClient } from '../../src/client/index.js';

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`client-job: ${name} is not set`);
  return value;
};
const job = env('JOB_ID');
const items = Number(env('ITEMS'));
const delayMs = Number(env('DELAY_MS'));
const perRun = env('KEYS') === 'per-run';

const client = new IdempotentClient({ baseUrl: env('BASE_URL'), headers: { authorization: `Bearer ${env('API_KEY')}` } });
for (let item = 0; item < items; item++) {
  const key = perRun ? randomUUID() : businessKey('payout', job, item);
  const answer = await client.post(
    '/charges',
    { amount: 1000 + item, currency: 'eur', customer: `cus-${job}-${item}`, simulate: { delayMs } },
    { key },
  );
  const body = answer.json<{ id?: string }>();
  console.log(JSON.stringify({ item, status: answer.status, replayed: answer.replayed, attempts: answer.attempts, id: body.id }));
}
