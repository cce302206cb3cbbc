import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import type { ClaimMode } from '../src/core/idempotency-store.js';
import { KeyInFlightError, LeaseLostError } from '../src/core/errors.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { sleep } from './support/http.js';
import { claimRequest, keyTableOptions } from './support/key-table.js';

/**
 * Promises the fast path must keep, each where it once broke: a claim given
 * back after a takeover keeps the key's history; a claim that waited for a
 * business connection past its lease never runs beside its taker; a hung
 * request-transaction attempt gives its key up at maxHold; and the same key in
 * two key tables never waits on itself. Engines with stores and pools of
 * their own stand for separate instances, so no duplicate is answered from
 * another's memory.
 */
describe('what a claim promises', () => {
  let schema: string;
  let db: pg.Client;
  const sources: DataSource[] = [];
  let n = 0;
  const fresh = () => `p-${Date.now()}-${++n}`;
  /** How many times each key's handler body started. */
  const started = new Map<string, number>();

  const open = async (poolSize = 10) => {
    const source = await openDataSource(dataSourceOptions(schema, { poolSize }));
    sources.push(source);
    return source;
  };
  const effects = async (key: string) =>
    (await db.query('SELECT count(*)::int AS count FROM effects WHERE label = $1', [key])).rows[0].count as number;
  const keyRow = async (key: string, table = 'idempotency_keys') =>
    (
      await db.query(
        `SELECT status, attempt, generation::text, recovery_point, lease_expires_at <= now() AS lapsed FROM ${table} WHERE key = $1`,
        [key],
      )
    ).rows[0] as
      { status: string; attempt: number; generation: string; recovery_point: string | null; lapsed: boolean } | undefined;
  const work = (key: string, claimMode: ClaimMode, run: (tx: EntityManager) => Promise<unknown> = async () => undefined) => ({
    tenant: 'tenant-a',
    key,
    fingerprint: 'fp',
    leaseMs: 30_000,
    ttlMs: 3_600_000,
    claimMode,
    heartbeat: false,
    onFailure: () => ({ action: 'keep' as const }),
    run: async (tx: EntityManager) => {
      started.set(key, (started.get(key) ?? 0) + 1);
      await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['tenant-a', key]);
      await run(tx);
      return { response: { status: 201, headers: [], body: Buffer.from(claimMode) }, result: claimMode };
    },
  });

  beforeAll(async () => {
    schema = await freshSchema('claim_promises');
    await createTables(schema);
    await createTables(schema, 'other_keys');
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await Promise.all(sources.map((source) => source.destroy()));
    await db.end();
  });

  describe('giving a claim back', () => {
    it("a takeover's claim given back keeps the key's generation and attempts: the next retry resumes the same use of the key", async () => {
      const store = new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions());
      const key = fresh();
      const first = await store.claim(claimRequest(key, { leaseMs: 100 }));
      expect(first.state).toBe('claimed');
      const generation = first.state === 'claimed' ? first.generation : '';
      await sleep(200);
      // The takeover (attempt 2) never runs its work: its BEGIN failed, its connection was lost, or a pipe refused it.
      const takeover = claimRequest(key);
      expect(await store.claim(takeover)).toMatchObject({ state: 'claimed', attempt: 2, generation });
      expect(await store.release(takeover)).toBe(true);
      expect(await keyRow(key)).toMatchObject({ status: 'in_flight', attempt: 2, generation, lapsed: true });
      // The retry takes over at once, with the generation the first attempt's downstream calls used.
      expect(await store.claim(claimRequest(key))).toMatchObject({ state: 'claimed', attempt: 3, generation });
      // The released attempt is fenced: its token owns nothing.
      expect(await store.complete(takeover, { status: 201, headers: [], body: null }, 60_000)).toBe(false);
    });

    it('a first claim given back is deleted: a retry runs at once, even with another request', async () => {
      const store = new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions());
      const key = fresh();
      const first = claimRequest(key);
      expect((await store.claim(first)).state).toBe('claimed');
      expect(await store.release(first)).toBe(true);
      expect(await keyRow(key)).toBeUndefined();
      expect(await store.claim(claimRequest(key, { fingerprint: 'corrected' }))).toMatchObject({ state: 'claimed', attempt: 1 });
    });
  });

  describe("a claim that waits for the business pool's connection", () => {
    it('outlasting its lease while another instance takes the key over: it never runs, only the taker does', async () => {
      // This instance: a business pool of one connection, held by another transaction, and a claim pool of its own.
      const main = await open(1);
      const claims = await open(2);
      const waiting = new IdempotencyEngine(
        new PostgresIdempotencyStore(main, 'idempotency_keys', { ...keyTableOptions(), claimDataSource: claims }),
      );
      const other = new IdempotencyEngine(new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions()));
      const key = fresh();
      const holder: QueryRunner = main.createQueryRunner();
      await holder.startTransaction();
      try {
        const stalled = waiting.execute({ ...work(key, 'separate'), leaseMs: 1_000, heartbeat: true });
        stalled.catch(() => undefined);
        // Its claim committed on the claim pool; its lease runs out while it waits for the business connection.
        await sleep(1_400);
        expect(await keyRow(key)).toMatchObject({ status: 'in_flight', lapsed: true });
        await expect(other.execute({ ...work(key, 'separate'), leaseMs: 1_000 })).resolves.toMatchObject({ kind: 'executed' });
        await sleep(600);
        await holder.rollbackTransaction();
        await holder.release();
        // It gets its connection, finds the key another attempt's, and does not run.
        await expect(stalled).rejects.toBeInstanceOf(KeyInFlightError);
      } finally {
        if (!holder.isReleased) await holder.release();
      }
      expect(started.get(key)).toBe(1);
      expect(await effects(key)).toBe(1);
    });
  });

  describe('maxHold in request-transaction mode', () => {
    it.each([
      ['waiting on another system (its connection idle in the transaction)', async () => sleep(4_000)],
      ['inside a statement of its own', async (tx: EntityManager) => void (await tx.query('SELECT pg_sleep(4)'))],
    ])(
      'a handler hung %s gives its key up at maxHold: a retry on another instance runs, and the hung work never commits',
      async (_, hang) => {
        const hungEngine = new IdempotencyEngine(
          new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions()),
        );
        const retryEngine = new IdempotencyEngine(
          new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions()),
        );
        const key = fresh();
        let holdExceeded = 0;
        const hung = hungEngine.execute({
          ...work(key, 'request-transaction', hang),
          maxHoldMs: 500,
          onHoldExceeded: () => holdExceeded++,
        });
        hung.catch(() => undefined);
        await sleep(250);
        // Within maxHold the key is held: a duplicate gets the 409.
        await expect(retryEngine.execute(work(key, 'request-transaction'))).rejects.toBeInstanceOf(KeyInFlightError);
        await sleep(700);
        expect(holdExceeded).toBe(1);
        await expect(retryEngine.execute(work(key, 'request-transaction'))).resolves.toMatchObject({ kind: 'executed' });
        await expect(hung).rejects.toBeInstanceOf(LeaseLostError);
        expect(started.get(key)).toBe(2);
        // Only the retry's write committed.
        expect(await effects(key)).toBe(1);
        expect(await keyRow(key)).toMatchObject({ status: 'completed' });
        // The hung attempt's connection was dropped, not lent again: its engine serves the next key as usual.
        await expect(hungEngine.execute(work(fresh(), 'request-transaction'))).resolves.toMatchObject({ kind: 'executed' });
      },
    );
  });

  describe('two key tables', () => {
    it.each(['request-transaction', 'separate'] as const)(
      'the same tenant and key in another table is another key: a %s claim there runs while the first table holds it',
      async (claimMode) => {
        const first = new IdempotencyEngine(new PostgresIdempotencyStore(await open(), 'idempotency_keys', keyTableOptions()));
        const second = new IdempotencyEngine(new PostgresIdempotencyStore(await open(), 'other_keys', keyTableOptions()));
        const key = fresh();
        const holding = first.execute(work(key, 'request-transaction', () => sleep(600)));
        await sleep(200);
        await expect(second.execute(work(key, claimMode))).resolves.toMatchObject({ kind: 'executed' });
        await expect(holding).resolves.toMatchObject({ kind: 'executed' });
        expect(await keyRow(key, 'other_keys')).toMatchObject({ status: 'completed' });
      },
    );
  });
});
