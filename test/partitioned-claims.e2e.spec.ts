import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { DataSource } from 'typeorm';
import { PostgresIdempotencyStore } from '../src/index.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { claimRequest, useKeyTable } from './support/key-table.js';

useKeyTable('partitioned');

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The partitioned table's claim on its own, at the store, where nothing in the
 * engine answers a duplicate from memory: every claim below reaches
 * PostgreSQL. Rows are put in an older partition ("yesterday") by updating
 * their `created_at`, which moves them there, to stand for a key claimed
 * before the partition boundary and retried after it.
 */
describe('claims on the partitioned key table', () => {
  let schema: string;
  let db: pg.Client;
  let sources: DataSource[];
  let stores: PostgresIdempotencyStore[];
  let n = 0;
  const fresh = () => `k-${Date.now()}-${++n}`;
  const response = (text: string) => ({
    status: 201,
    headers: [['content-type', 'text/plain']] as Array<[string, string]>,
    body: Buffer.from(text),
  });
  /** The key's rows, with the partition each is in. */
  const rows = async (key: string) =>
    (
      await db.query(
        `SELECT tableoid::regclass::text AS partition, status, attempt, owner_token, generation
           FROM idempotency_keys WHERE tenant_id = 'tenant-a' AND key = $1 ORDER BY created_at`,
        [key],
      )
    ).rows;
  const toYesterday = (key: string) =>
    db.query(`UPDATE idempotency_keys SET created_at = created_at - interval '1 day' WHERE key = $1`, [key]);

  beforeAll(async () => {
    schema = await freshSchema('partitioned_claims');
    await createTables(schema);
    db = await sqlClient(schema);
    // Yesterday and the day before, below the partitions the migration made from today on.
    await db.query(`DO $$ DECLARE today timestamptz := date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00');
      BEGIN EXECUTE format('CREATE TABLE idempotency_keys_earlier PARTITION OF idempotency_keys FOR VALUES FROM (%L) TO (%L)',
                           today - interval '2 days', today); END $$`);
    sources = await Promise.all([0, 1].map(() => openDataSource(dataSourceOptions(schema, { poolSize: 25 }))));
    stores = sources.map((s) => new PostgresIdempotencyStore(s, 'idempotency_keys', { partitioned: true }));
  });
  afterAll(async () => {
    await Promise.all(sources.map((s) => s.destroy()));
    await db.end();
  });
  it('40 concurrent claims of a new key from two instances: one claims it, one row', async () => {
    const key = fresh();
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) => stores[i % 2].claim(claimRequest(key))));
    expect(results.filter((r) => r.state === 'claimed')).toHaveLength(1);
    expect(results.filter((r) => r.state === 'in-flight')).toHaveLength(39);
    expect(await rows(key)).toHaveLength(1);
  });

  it('a claim of a key whose uncommitted claim holds its lock: a separate one is in flight at once, a request-transaction one waits and answers what committed', async () => {
    const key = fresh();
    const first = claimRequest(key);
    // request-transaction mode: the claim is a statement of a transaction that stays open (and holds the key's lock).
    const begun = await stores[0].begin(first, 'request-transaction', 5_000);
    expect(begun.claim.state).toBe('claimed');
    // A separate claim never waits for it (a claim connection held for a whole handler): the key is in flight.
    expect(await stores[1].claim(claimRequest(key))).toMatchObject({ state: 'in-flight' });
    let settled = false;
    const second = stores[1].begin(claimRequest(key), 'request-transaction', 5_000).finally(() => (settled = true));
    await sleep(300);
    // It waits for the key's lock: its own row would not conflict.
    expect(settled).toBe(false);
    expect(await begun.attempt!.commit(response('first'), 3_600_000)).toBe(true);
    const answer = (await second).claim;
    expect(answer).toMatchObject({ state: 'completed', response: { status: 201 } });
    expect(answer.state === 'completed' && answer.response.body?.toString()).toBe('first');
    expect(await rows(key)).toHaveLength(1);
  });

  it('a retry in a newer partition finds its original claim in an older one: 409, 422, then the replay', async () => {
    const key = fresh();
    const original = claimRequest(key);
    expect((await stores[0].claim(original)).state).toBe('claimed');
    await toYesterday(key);
    expect(await stores[1].claim(claimRequest(key))).toMatchObject({ state: 'in-flight' });
    expect(await stores[1].claim(claimRequest(key, { fingerprint: 'other' }))).toEqual({ state: 'mismatch' });
    // The owner's heartbeat and completion find the row where it is.
    expect(await stores[0].renewLease(original, 30_000)).toBe(true);
    expect(await stores[0].complete(original, response('done'), 3_600_000)).toBe(true);
    const replay = await stores[1].claim(claimRequest(key));
    expect(replay.state === 'completed' && replay.response.body?.toString()).toBe('done');
    expect(await stores[1].claim(claimRequest(key, { fingerprint: 'other' }))).toEqual({ state: 'mismatch' });
    expect((await rows(key)).map((r) => r.partition)).toEqual(['idempotency_keys_earlier']);
  });

  it('a release in an older partition frees the key: the next claim takes it in the partition of now', async () => {
    const key = fresh();
    const original = claimRequest(key);
    await stores[0].claim(original);
    await toYesterday(key);
    expect(await stores[0].release(original)).toBe(true);
    expect((await stores[1].claim(claimRequest(key))).state).toBe('claimed');
    expect((await rows(key)).map((r) => r.partition)).not.toContain('idempotency_keys_earlier');
  });

  it('a lapsed lease in an older partition is taken over in place; the stale owner is fenced', async () => {
    const key = fresh();
    const stale = claimRequest(key, { leaseMs: 1 });
    const first = await stores[0].claim(stale);
    await toYesterday(key);
    await sleep(20);
    const takeover = claimRequest(key);
    const claim = await stores[1].claim(takeover);
    expect(claim).toMatchObject({ state: 'claimed', attempt: 2 });
    // A takeover finishes the same work: the same generation.
    expect(claim.state === 'claimed' && first.state === 'claimed' && claim.generation).toBe(
      first.state === 'claimed' && first.generation,
    );
    expect(await stores[0].complete(stale, response('stale'), 3_600_000)).toBe(false);
    expect(await stores[1].complete(takeover, response('new'), 3_600_000)).toBe(true);
    const found = await rows(key);
    expect(found).toHaveLength(1);
    expect(found[0]).toMatchObject({
      partition: 'idempotency_keys_earlier',
      status: 'completed',
      owner_token: takeover.ownerToken,
    });
  });

  it('20 concurrent takeovers of a lapsed key: one takes it', async () => {
    const key = fresh();
    await stores[0].claim(claimRequest(key, { leaseMs: 1 }));
    await toYesterday(key);
    await sleep(20);
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => stores[i % 2].claim(claimRequest(key))));
    expect(results.filter((r) => r.state === 'claimed')).toHaveLength(1);
    expect(await rows(key)).toHaveLength(1);
  });

  it("a key whose lease and TTL both ended is a new use: its old row goes, so its owner's completion is fenced", async () => {
    const key = fresh();
    const dead = claimRequest(key, { leaseMs: 1, ttlMs: 1 });
    const first = await stores[0].claim(dead);
    await toYesterday(key);
    await sleep(20);
    const reuse = claimRequest(key, { fingerprint: 'another request' });
    const claim = await stores[1].claim(reuse);
    expect(claim).toMatchObject({ state: 'claimed', attempt: 1 });
    expect(claim.state === 'claimed' && first.state === 'claimed' && claim.generation).not.toBe(
      first.state === 'claimed' && first.generation,
    );
    // Had the old row stayed, its owner could complete it beside the new attempt: two executions.
    expect(await stores[0].complete(dead, response('late'), 3_600_000)).toBe(false);
    expect(await stores[1].complete(reuse, response('new'), 3_600_000)).toBe(true);
    const found = await rows(key);
    expect(found).toHaveLength(1);
    expect(found[0].partition).not.toBe('idempotency_keys_earlier');
  });

  it('a completed key past its TTL in an older partition stays there, inert; 30 concurrent reuses claim it once', async () => {
    const key = fresh();
    const old = claimRequest(key);
    await stores[0].claim(old);
    await stores[0].complete(old, response('old'), 1);
    await toYesterday(key);
    await sleep(20);
    const results = await Promise.all(
      Array.from({ length: 30 }, (_, i) => stores[i % 2].claim(claimRequest(key, { fingerprint: 'new' }))),
    );
    expect(results.filter((r) => r.state === 'claimed')).toHaveLength(1);
    const found = await rows(key);
    expect(found.map((r) => [r.partition === 'idempotency_keys_earlier', r.status])).toEqual([
      [true, 'completed'],
      [false, 'in_flight'],
    ]);
    // The replay is the new use's, never the inert one's.
    const owner = found[1].owner_token as string;
    expect(await stores[0].complete({ tenant: 'tenant-a', key, ownerToken: owner }, response('new'), 3_600_000)).toBe(true);
    const replay = await stores[1].claim(claimRequest(key, { fingerprint: 'new' }));
    expect(replay.state === 'completed' && replay.response.body?.toString()).toBe('new');
  });

  it('a claim that would write refuses to run under REPEATABLE READ, where it could miss a key just committed', async () => {
    const key = fresh();
    const client = await sqlClient(schema);
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await expect(
        client.query(`SELECT * FROM idempotency_keys_claim($1, $2, 'fp', $3, 30000, 3600000, 1000)`, [
          'tenant-a',
          key,
          randomUUID(),
        ]),
      ).rejects.toMatchObject({ code: '0A000' });
      await client.query('ROLLBACK');
      const other = claimRequest(key);
      expect((await stores[0].claim(other)).state).toBe('claimed');
      expect(await stores[0].complete(other, response('other'), 3_600_000)).toBe(true);
      // With a snapshot taken after the commit, the same claim replays it: it answers at any isolation level.
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      const { rows: answer } = await client.query(
        `SELECT state FROM idempotency_keys_claim($1, $2, 'fp', $3, 30000, 3600000, NULL)`,
        ['tenant-a', key, randomUUID()],
      );
      expect(answer).toEqual([{ state: 'completed' }]);
      await client.query('ROLLBACK');
    } finally {
      await client.end();
    }
  });
});
