import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:http';
import { IdempotentClient, type IdempotentResponse } from '../../src/client/index.js';

const INTENTS = 60;
const CONCURRENCY = 6;
const MAX_ATTEMPTS = 10;
const BUDGET = { ratio: 0.2, minRetries: 10, window: 60_000 };

/** A server in a full outage: every answer is a 503 that says "retry at once". Counts requests and keys. */
class OutageServer {
  requests = 0;
  readonly keys = new Map<string, number>();
  private server?: Server;
  port = 0;

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      this.requests++;
      const key = String(req.headers['idempotency-key']);
      this.keys.set(key, (this.keys.get(key) ?? 0) + 1);
      req.resume();
      req.on('end', () => {
        res.writeHead(503, { 'retry-after': '0', 'content-type': 'application/problem+json' });
        res.end(JSON.stringify({ type: 'about:blank', title: 'Service Unavailable', status: 503 }));
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
  }

  reset(): void {
    this.requests = 0;
    this.keys.clear();
  }

  stop(): Promise<void> {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

async function sendIntents(client: IdempotentClient): Promise<IdempotentResponse[]> {
  const results: IdempotentResponse[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      for (let i = next++; i < INTENTS; i = next++) results[i] = await client.post('/charges', { amount: 1, intent: i });
    }),
  );
  return results;
}

describe('the client during a full outage (every answer 503, Retry-After: 0)', () => {
  const outage = new OutageServer();
  beforeAll(() => outage.start());
  afterAll(() => outage.stop());

  it(`retries stay within the budget (${BUDGET.minRetries} + ${BUDGET.ratio} x requests), not ${MAX_ATTEMPTS} attempts per intent`, async () => {
    outage.reset();
    const client = new IdempotentClient({
      baseUrl: `http://127.0.0.1:${outage.port}`,
      maxAttempts: MAX_ATTEMPTS,
      initialDelay: 5,
      maxDelay: 40,
      budget: BUDGET,
    });
    const results = await sendIntents(client);

    const retries = outage.requests - INTENTS;
    expect(retries).toBeLessThanOrEqual(BUDGET.minRetries + BUDGET.ratio * INTENTS);
    // The floor alone allows this many; the budget was drawn on, not bypassed.
    expect(retries).toBeGreaterThanOrEqual(BUDGET.minRetries);
    // What the client counted is what the server saw, and each intent kept its one key.
    expect(results.reduce((sum, r) => sum + r.attempts, 0)).toBe(outage.requests);
    expect(outage.keys.size).toBe(INTENTS);
    expect(results.map((r) => outage.keys.get(r.key))).toEqual(results.map((r) => r.attempts));
    // Every intent ends with the 503 it last got, saying why the client stopped.
    expect(new Set(results.map((r) => r.status))).toEqual(new Set([503]));
    expect(results.every((r) => r.gaveUp === 'budget' || r.gaveUp === 'attempts')).toBe(true);
    expect(results.filter((r) => r.gaveUp === 'budget').length).toBeGreaterThan(INTENTS / 2);
  });

  it(`without a budget to speak of, the same outage costs ${MAX_ATTEMPTS} requests per intent: what the budget prevents`, async () => {
    outage.reset();
    const client = new IdempotentClient({
      baseUrl: `http://127.0.0.1:${outage.port}`,
      maxAttempts: MAX_ATTEMPTS,
      initialDelay: 5,
      maxDelay: 40,
      budget: { ratio: 1, minRetries: 1_000_000 },
    });
    const results = await sendIntents(client);
    expect(outage.requests).toBe(INTENTS * MAX_ATTEMPTS);
    expect(results.every((r) => r.gaveUp === 'attempts')).toBe(true);
  });
});
