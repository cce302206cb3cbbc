import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTableStatements } from '../src/store/sql.js';
import { createTables, databaseUrl, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';
import { throughWireCounter, WireCounter } from './support/wire-counter.js';

const CLAIM = /^\/\* nest-idempotency:claim \*\/ SELECT \* FROM "idempotency_keys_claim"/;
const COMPLETE = /^\/\* nest-idempotency:complete \*\//;
/** The claim's message, as the server sees it: the claim alone, its own transaction; no transaction left open after it. */
const CLAIM_EXCHANGE = { statements: [expect.stringMatching(CLAIM)], ready: ['I'] };
/** The claim inside a READ COMMITTED transaction of its own, committed: where the connection defaults to another level. */
const CLAIM_IN_TRANSACTION = {
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

/**
 * A server whose default is REPEATABLE READ. Work left at that default keeps
 * the claim's message with its BEGIN and the key's lock (the lock must be held
 * before the handler runs); work the data source puts at READ COMMITTED gets
 * the one-round-trip replay. Either way the claim runs at READ COMMITTED.
 */
describe.each([
  { name: 'the work at the server default', isolationLevel: undefined },
  { name: 'the data source at READ COMMITTED', isolationLevel: 'READ COMMITTED' },
] as const)('the database defaults to REPEATABLE READ, $name', ({ isolationLevel }) => {
  const database = `one_trip_rr_${isolationLevel ? 'rc' : 'default'}`;
  const url = Object.assign(new URL(databaseUrl()), { pathname: `/${database}` }).toString();
  let wire: WireCounter;
  let source: DataSource;
  let engine: IdempotencyEngine<EntityManager>;
  let runs = 0;

  beforeAll(async () => {
    const admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    try {
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.query(`CREATE DATABASE "${database}"`);
      await admin.query(`ALTER DATABASE "${database}" SET default_transaction_isolation = 'repeatable read'`);
    } finally {
      await admin.end();
    }
    const ddl = new pg.Client({ connectionString: url });
    await ddl.connect();
    for (const statement of createTableStatements('idempotency_keys')) await ddl.query(statement);
    await ddl.end();
    const target = new URL(databaseUrl());
    wire = new WireCounter(Number(target.port || 5432), target.hostname);
    await wire.start();
    const proxied = Object.assign(new URL(throughWireCounter(databaseUrl(), wire)), { pathname: `/${database}` }).toString();
    source = await openDataSource({
      type: 'postgres',
      url: proxied,
      extra: { max: 4 },
      ...(isolationLevel ? { isolationLevel } : {}),
    } as never);
    const store = new PostgresIdempotencyStore(source, 'idempotency_keys');
    engine = new IdempotencyEngine(store);
  });
  afterAll(async () => {
    await source?.destroy();
    await wire?.stop();
    const admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
    await admin.end();
  });

  const work = (key: string) => ({
    tenant: 't',
    key,
    fingerprint: 'same',
    leaseMs: 30_000,
    ttlMs: 60_000,
    claimMode: 'separate' as const,
    heartbeat: false,
    onFailure: () => ({ action: 'keep' as const }),
    run: async (tx: EntityManager) => {
      runs++;
      const [{ level }] = (await tx.query("SELECT current_setting('transaction_isolation') AS level")) as Array<{
        level: string;
      }>;
      return { response: { status: 201, headers: [], body: Buffer.from(level) }, result: level };
    },
  });
  const settled = async () => {
    let seen = -1;
    while (seen !== wire.exchanges.length) {
      seen = wire.exchanges.length;
      await sleep(150);
    }
    return wire.summary();
  };

  it('a new key in three round trips, the claim at READ COMMITTED, the work at its own level; a replay as the docs say', async () => {
    await sleep(200);
    wire.reset();
    const first = await engine.execute(work('rr-1'));
    expect(first).toMatchObject({ kind: 'executed' });
    expect((first as { response: { body: Buffer } }).response.body.toString()).toBe(
      isolationLevel ? 'read committed' : 'repeatable read',
    );
    const newKey = await settled();
    if (isolationLevel) {
      // The claim alone ran at the connection's REPEATABLE READ: it wrote nothing and asked for READ COMMITTED (had it
      // written, the claim after it would have found the key in flight and nothing would have run). The store sends
      // the claim inside its own READ COMMITTED transaction from then on.
      expect(newKey).toHaveLength(4);
      expect(newKey[0]).toEqual(CLAIM_EXCHANGE);
      expect(newKey[1]).toEqual(CLAIM_IN_TRANSACTION);
    } else {
      expect(newKey).toHaveLength(3);
      expect(newKey[0].statements.slice(0, 3)).toEqual([
        'BEGIN ISOLATION LEVEL READ COMMITTED',
        expect.stringMatching(CLAIM),
        'COMMIT',
      ]);
    }
    wire.reset();
    await expect(engine.execute(work('rr-1'))).resolves.toMatchObject({ kind: 'replayed' });
    const replay = await settled();
    if (isolationLevel) {
      expect(replay).toEqual([CLAIM_IN_TRANSACTION]);
      // And a new key from then on: three round trips again.
      wire.reset();
      await expect(engine.execute(work('rr-2'))).resolves.toMatchObject({ kind: 'executed' });
      const next = await settled();
      expect(next).toHaveLength(3);
      expect(next[0]).toEqual(CLAIM_IN_TRANSACTION);
    } else {
      // The fused message: the work's BEGIN and the key's lock ride with the claim; a replay rolls that back after it.
      expect(replay).toEqual([
        {
          statements: [
            'BEGIN ISOLATION LEVEL READ COMMITTED',
            expect.stringMatching(CLAIM),
            'COMMIT',
            'START TRANSACTION',
            expect.stringMatching(/hold_key_lock|pg_try_advisory_xact_lock/),
          ],
          ready: ['T', 'T', 'I', 'T', 'T'],
        },
        { statements: ['ROLLBACK'], ready: ['I'] },
      ]);
    }
  });

  it('concurrent duplicates: one run, the others replay or answer in flight', async () => {
    for (let burst = 0; burst < 3; burst++) {
      const key = `rr-burst-${burst}`;
      const before = runs;
      const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => engine.execute({ ...work(key), waitMs: 5_000 })));
      const kinds = outcomes.map((o) => (o.status === 'fulfilled' ? o.value.kind : (o.reason as Error).name));
      expect(kinds.filter((kind) => kind === 'executed')).toHaveLength(1);
      expect(kinds.every((kind) => kind === 'executed' || kind === 'replayed')).toBe(true);
      expect(runs - before).toBe(1);
    }
  });
});
