import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import type { ClaimMode } from '../src/core/idempotency-store.js';
import { KeyInFlightError, LeaseLostError } from '../src/core/errors.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource } from './support/database.js';
import { sleep } from './support/http.js';

/**
 * request-transaction mode writes a new key once, completed, and serialises
 * duplicates on the key with a transaction-scoped lock instead of an
 * in-flight row. Engines here stand for separate processes (each has its own
 * in-process map), all on one real database.
 */
describe('request-transaction claims under races', () => {
  let dataSource: DataSource;
  let engines: Array<IdempotencyEngine<EntityManager>>;
  let n = 0;
  const effects = async (key: string) =>
    (
      (await dataSource.query('SELECT count(*)::int AS count FROM effects WHERE label = $1', [key])) as Array<{ count: number }>
    )[0].count;
  /** How many times each key's handler body started: a duplicate must never start one while another attempt holds the key. */
  const started = new Map<string, number>();
  const work = (key: string, claimMode: ClaimMode, delayMs: number, waitMs = 0) => ({
    tenant: 't',
    key,
    fingerprint: 'same',
    leaseMs: 30_000,
    ttlMs: 60_000,
    claimMode,
    waitMs,
    heartbeat: false,
    onFailure: () => ({ action: 'keep' as const }),
    run: async (tx: EntityManager) => {
      started.set(key, (started.get(key) ?? 0) + 1);
      await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key]);
      await sleep(delayMs);
      return { response: { status: 201, headers: [], body: Buffer.from(claimMode) }, result: claimMode };
    },
  });

  beforeAll(async () => {
    const schema = await freshSchema('request_transaction_races');
    await createTables(schema);
    dataSource = await openDataSource({ ...dataSourceOptions(schema, { poolSize: 40 }) });
    const store = new PostgresIdempotencyStore(dataSource, 'idempotency_keys');
    engines = Array.from({ length: 6 }, () => new IdempotencyEngine(store));
  });
  afterAll(async () => {
    await dataSource?.destroy();
  });

  it('30 concurrent duplicates over six processes: one execution, every other one waits and replays it', async () => {
    const key = `race-${++n}`;
    const outcomes = await Promise.allSettled(
      Array.from({ length: 30 }, (_, i) => engines[i % engines.length].execute(work(key, 'request-transaction', 200, 10_000))),
    );
    const kinds = outcomes.map((o) => (o.status === 'fulfilled' ? o.value.kind : (o.reason as Error).name));
    expect(kinds.filter((k) => k === 'executed')).toHaveLength(1);
    expect(kinds.filter((k) => k === 'replayed')).toHaveLength(29);
    expect(await effects(key)).toBe(1);
  });

  it('a duplicate that waits past its bound gets a 409, and nothing of it commits', async () => {
    const key = `race-${++n}`;
    const original = engines[0].execute(work(key, 'request-transaction', 800));
    await sleep(150);
    await expect(engines[1].execute(work(key, 'request-transaction', 0, 100))).rejects.toBeInstanceOf(KeyInFlightError);
    await expect(original).resolves.toMatchObject({ kind: 'executed' });
    expect(await effects(key)).toBe(1);
  });

  it('a separate claim of a key held by an uncommitted request-transaction attempt is in flight: one handler runs', async () => {
    const key = `race-${++n}`;
    // The request-transaction attempt holds the key's lock and has written no row yet.
    const inTransaction = engines[0].execute(work(key, 'request-transaction', 600));
    await sleep(150);
    await expect(engines[1].execute(work(key, 'separate', 0))).rejects.toBeInstanceOf(KeyInFlightError);
    await expect(inTransaction).resolves.toMatchObject({ kind: 'executed' });
    expect(started.get(key)).toBe(1);
    expect(await effects(key)).toBe(1);
    const replay = await engines[2].execute(work(key, 'separate', 0));
    expect(replay.kind).toBe('replayed');
    expect(replay.response.body?.toString()).toBe('request-transaction');
  });

  it('a request-transaction claim of a key held by a running separate attempt is in flight: one handler runs', async () => {
    const key = `race-${++n}`;
    const separate = engines[0].execute(work(key, 'separate', 600));
    await sleep(150);
    await expect(engines[1].execute(work(key, 'request-transaction', 0))).rejects.toBeInstanceOf(KeyInFlightError);
    await expect(separate).resolves.toMatchObject({ kind: 'executed' });
    expect(started.get(key)).toBe(1);
    expect(await effects(key)).toBe(1);
  });

  it('concurrent duplicates through both claim modes on several processes: one handler runs, the rest replay or get 409', async () => {
    const key = `race-${++n}`;
    const outcomes = await Promise.allSettled(
      Array.from({ length: 16 }, (_, i) =>
        engines[i % engines.length].execute(work(key, i % 2 === 0 ? 'separate' : 'request-transaction', 150, 0)),
      ),
    );
    const kinds = outcomes.map((o) => (o.status === 'fulfilled' ? o.value.kind : (o.reason as Error).name));
    expect(kinds.filter((k) => k === 'executed')).toHaveLength(1);
    expect(kinds.every((k) => k === 'executed' || k === 'replayed' || k === 'KeyInFlightError')).toBe(true);
    expect(started.get(key)).toBe(1);
    expect(await effects(key)).toBe(1);
  });

  it('takes over a separate attempt whose lease and TTL both lapsed, and fences that attempt if it completes later', async () => {
    const key = `race-${++n}`;
    const slow = engines[0].execute({ ...work(key, 'separate', 1_200), leaseMs: 300, ttlMs: 300 });
    await sleep(600);
    // The retry is still running when the hung attempt tries to complete (at about 1.2 s).
    const retry = await engines[1].execute(work(key, 'request-transaction', 1_000));
    expect(retry.kind).toBe('executed');
    // The hung attempt's completion finds the key taken: its work is thrown away, not the retry's.
    await expect(slow).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effects(key)).toBe(1);
    const replay = await engines[2].execute(work(key, 'separate', 0));
    expect(replay.response.body?.toString()).toBe('request-transaction');
  });

  it('takes over a separate attempt whose lease lapsed, and fences that attempt if it completes later', async () => {
    const key = `race-${++n}`;
    const slow = engines[0].execute({ ...work(key, 'separate', 1_200), leaseMs: 300 });
    await sleep(600);
    const takeover = await engines[1].execute(work(key, 'request-transaction', 0));
    expect(takeover.kind).toBe('executed');
    await expect(slow).rejects.toBeInstanceOf(LeaseLostError);
    expect(await effects(key)).toBe(1);
  });
});
