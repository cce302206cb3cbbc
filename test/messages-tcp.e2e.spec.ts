import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ClientProxyFactory, Transport, type ClientProxy } from '@nestjs/microservices';
import { firstValueFrom } from 'rxjs';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createEffectLedgerStatements } from '../src/ledger/effect-ledger.sql.js';
import { startConsumer, type ConsumerApp } from './support/consumer-app.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { freePort } from './reliability/support/sample-process.js';

/**
 * A transport without acknowledgements (Nest's TCP): nothing can be
 * requeued, so a duplicate that finds the key in flight gets an error saying
 * when to retry, as an HTTP 409 would, and a completed key replays.
 */
describe('idempotent MessagePattern handlers on a transport without acknowledgements (TCP)', () => {
  let db: pg.Client;
  let consumer: ConsumerApp;
  let client: ClientProxy;
  let n = 0;
  const fresh = () => `tcp-${Date.now()}-${++n}`;
  const quote = (data: Record<string, unknown>) => firstValueFrom(client.send('refund.quote', data));

  beforeAll(async () => {
    const schema = await freshSchema('messages_tcp');
    await createTables(schema);
    db = await sqlClient(schema);
    for (const statement of createEffectLedgerStatements('effect_ledger')) await db.query(statement);
    const port = await freePort();
    consumer = await startConsumer(schema, { tcp: { host: '127.0.0.1', port } });
    client = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
    await client.connect();
  });
  afterAll(async () => {
    await client?.close();
    await consumer?.close();
    await db?.end();
  });

  it('takes the key from the payload, answers once and replays the stored reply', async () => {
    const label = fresh();
    const first = await quote({ label, idempotencyKey: `k-${label}` });
    const second = await quote({ label, idempotencyKey: `k-${label}` });
    expect(first).toEqual({ label, invocation: 1, quotedAt: '2026-01-01T00:00:00.000Z' });
    expect(second).toEqual(first);
    expect(consumer.probe.count(label)).toBe(1);
  });

  it.each([
    ['empty', ''],
    ['a number', 42],
    ['a string with a lone surrogate', 'tenant-a\ud800'],
    ['a string with a NUL', 'tenant-a\u0000'],
  ])('refuses a message whose tenant is %s, as one whose resolver finds none: nothing claimed or run', async (_case, tenant) => {
    const label = fresh();
    // JSON carries a lone surrogate as the escape \ud800, which the consumer parses back into one.
    await expect(quote({ label, idempotencyKey: `k-${label}`, tenant })).rejects.toMatchObject({
      status: 'error',
      message: expect.stringContaining('tenant resolver'),
    });
    expect(consumer.probe.count(label)).toBe(0);
    expect((await db.query('SELECT count(*) FROM idempotency_keys WHERE key = $1', [`k-${label}`])).rows[0].count).toBe('0');
  });

  it('answers a duplicate that finds the key in flight with a conflict error and retryAfter, never silence', async () => {
    const label = fresh();
    const first = quote({ label, idempotencyKey: `k-${label}`, delayMs: 800 });
    while (consumer.probe.count(label) === 0) await new Promise((r) => setTimeout(r, 10));
    await expect(quote({ label, idempotencyKey: `k-${label}`, delayMs: 800 })).rejects.toMatchObject({
      status: 'error',
      type: ProblemType.conflict,
      retryAfter: expect.any(Number),
    });
    expect((await first).invocation).toBe(1);
  });
});
