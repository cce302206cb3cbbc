import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { createTables, databaseUrl, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';
import { throughWireCounter, WireCounter } from './support/wire-counter.js';

const CLAIM = /^\/\* nest-idempotency:claim \*\/ SELECT \* FROM "idempotency_keys_claim"/;
const COMPLETE = /^\/\* nest-idempotency:complete \*\//;
/** The claim's message, as the server sees it: its own transaction, committed; no transaction left open after it. */
const CLAIM_EXCHANGE = {
  statements: ['BEGIN ISOLATION LEVEL READ COMMITTED', expect.stringMatching(CLAIM), 'COMMIT'],
  ready: ['T', 'T', 'I'],
};

/**
 * Round trips and transactions counted where the server sees them: a proxy
 * reading the protocol between the app and PostgreSQL (each write of the app
 * one round trip, the transaction status of each ReadyForQuery).
 */
describe.each(ADAPTERS)('a replay, a 409 and a 422 in one round trip, no transaction opened, over %s', (adapter) => {
  let counted: TestApp;
  let other: TestApp;
  let wire: WireCounter;
  let db: pg.Client;
  let n = 0;
  const fresh = () => `${adapter}-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  /** What the server saw since `wire.reset()`, once nothing more has arrived for a while (a ROLLBACK after the answer would). */
  const settled = async () => {
    let seen = -1;
    while (seen !== wire.exchanges.length) {
      seen = wire.exchanges.length;
      await sleep(150);
    }
    return wire.summary();
  };

  beforeAll(async () => {
    const schema = await freshSchema(`one_trip_${adapter}`);
    await createTables(schema);
    const target = new URL(databaseUrl());
    wire = new WireCounter(Number(target.port || 5432), target.hostname);
    await wire.start();
    counted = await startTestApp(adapter, schema, {}, { url: throughWireCounter(databaseUrl(), wire) });
    // Another instance (its own engine and pools): a key it holds is in flight in the database, not in `counted`'s memory.
    other = await startTestApp(adapter, schema);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await counted?.close();
    await other?.close();
    await wire?.stop();
    await db?.end();
  });

  it('a new key: the claim, then the BEGIN with the first statement, then the completion and COMMIT (three round trips)', async () => {
    const label = fresh();
    await settled();
    wire.reset();
    expect((await post(counted.url, '/items', { label }, `k-${label}`)).status).toBe(201);
    expect(await settled()).toEqual([
      CLAIM_EXCHANGE,
      // One batch, one Sync: had the BEGIN failed, PostgreSQL would have skipped the INSERT.
      { statements: ['START TRANSACTION', expect.stringMatching(/^INSERT INTO effects/)], ready: ['T'] },
      { statements: [expect.stringMatching(COMPLETE), 'COMMIT'], ready: ['T', 'I'] },
    ]);
    expect(await effects(label)).toBe(1);
  });

  it('a replay: one round trip, and the server never had a transaction open for it', async () => {
    const label = fresh();
    const first = await post(counted.url, '/items', { label }, `k-${label}`);
    await settled();
    wire.reset();
    const replay = await post(counted.url, '/items', { label }, `k-${label}`);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(replay.body, first.body)).toBe(0);
    expect(await settled()).toEqual([CLAIM_EXCHANGE]);
    expect(await effects(label)).toBe(1);
  });

  it('a 422 (another body under the key): one round trip, no transaction', async () => {
    const label = fresh();
    await post(counted.url, '/items', { label }, `k-${label}`);
    await settled();
    wire.reset();
    expect((await post(counted.url, '/items', { label, other: true }, `k-${label}`)).status).toBe(422);
    expect(await settled()).toEqual([CLAIM_EXCHANGE]);
  });

  it('a 409 (the key in flight on another instance): one round trip, no transaction', async () => {
    const label = fresh();
    other.probe.delays.set(label, [1_500]);
    const holder = post(other.url, '/slow', { label }, `k-${label}`);
    for (let i = 0; i < 300 && other.probe.count(label) === 0; i++) await sleep(10);
    await settled();
    wire.reset();
    const conflict = await post(counted.url, '/slow', { label }, `k-${label}`);
    expect(conflict.status).toBe(409);
    expect(await settled()).toEqual([CLAIM_EXCHANGE]);
    expect((await holder).status).toBe(201);
    expect(await effects(label)).toBe(1);
  });

  it('a handler that sends no statement: its transaction opens in the completion message (two round trips)', async () => {
    const label = fresh();
    await settled();
    wire.reset();
    expect((await post(counted.url, '/text', { label }, `k-${label}`)).status).toBe(201);
    expect(await settled()).toEqual([
      CLAIM_EXCHANGE,
      { statements: ['START TRANSACTION', expect.stringMatching(COMPLETE), 'COMMIT'], ready: ['T', 'T', 'I'] },
    ]);
    const replay = await post(counted.url, '/text', { label }, `k-${label}`);
    expect(replay.headers['idempotent-replayed']).toBe('true');
  });

  it('a handler that fails before any statement: nothing sent for its ROLLBACK', async () => {
    const label = fresh();
    await settled();
    wire.reset();
    // A validation pipe's 400: rejected before the handler body, the key released.
    expect((await post(counted.url, '/validated', { label, amount: 0 }, `k-${label}`)).status).toBe(400);
    const seen = await settled();
    expect(seen[0]).toEqual(CLAIM_EXCHANGE);
    // The release runs on the claim pool; no ROLLBACK of a transaction that never opened.
    expect(seen.flatMap((exchange) => exchange.statements)).not.toContain('ROLLBACK');
    expect(seen.flatMap((exchange) => exchange.statements)).not.toContain('START TRANSACTION');
  });

  it('concurrent duplicates on two instances: one execution, one effect, every other answer a replay or a 409', async () => {
    for (let burst = 0; burst < 3; burst++) {
      const label = fresh();
      const answers = await Promise.all(
        Array.from({ length: 12 }, (_, i) => post((i % 2 ? other : counted).url, '/items', { label }, `k-${label}`)),
      );
      const statuses = answers.map((answer) => answer.status);
      expect(statuses.every((status) => status === 201 || status === 409)).toBe(true);
      expect(answers.filter((answer) => answer.status === 201 && !answer.headers['idempotent-replayed'])).toHaveLength(1);
      expect(counted.probe.count(label) + other.probe.count(label)).toBe(1);
      expect(await effects(label)).toBe(1);
    }
  });
});
