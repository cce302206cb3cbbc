import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { DataSource } from 'typeorm';
import { IdempotencyHealthIndicator, IdempotencyHealthModule } from '../src/health/index.js';
import { IdempotencyModule, PostgresIdempotencyStore } from '../src/index.js';
import { IdempotencyStore } from '../src/store/index.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { claimRequest, useKeyTable } from './support/key-table.js';
import { liveRowQuery } from '../src/store/partitioned/partitioned-key-table.sql.js';

useKeyTable('partitioned');

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const SWEEP = { batchSize: 250, maxDurationMs: 10_000 };

/**
 * Retention on the partitioned key table: whole partitions dropped once
 * nothing in them is live, never a row deleted from one, partitions kept made
 * ahead, and the default partition as the safety net when upkeep falls behind.
 * Each test gets a partition "earlier" for the day before today (when rows of
 * yesterday's claims would be), below the ones the migration made.
 */
describe('retention by partitions', () => {
  let schema: string;
  let db: pg.Client;
  let sources: DataSource[];
  let store: PostgresIdempotencyStore;
  let other: PostgresIdempotencyStore;
  let n = 0;
  const fresh = () => `r-${Date.now()}-${++n}`;
  const exists = async (relation: string) =>
    (await db.query('SELECT to_regclass($1) IS NOT NULL AS found', [relation])).rows[0].found as boolean;
  const count = async (relation: string) => Number((await db.query(`SELECT count(*) FROM ${relation}`)).rows[0].count);
  /** `count` rows claimed yesterday, in the state given, all in partition "earlier". */
  const seed = (prefix: string, rows: number, state: 'expired' | 'expired-long-ago' | 'live' | 'dead' | 'leased') => {
    const [status, lease, expires] = {
      expired: ['completed', "now() - interval '2 hours'", "now() - interval '1 second'"],
      'expired-long-ago': ['completed', "now() - interval '3 hours'", "now() - interval '2 hours'"],
      live: ['completed', "now() - interval '2 hours'", "now() + interval '1 hour'"],
      dead: ['in_flight', "now() - interval '1 second'", "now() - interval '1 second'"],
      leased: ['in_flight', "now() + interval '1 hour'", "now() - interval '1 second'"],
    }[state];
    return db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor,
                                    created_at)
       SELECT 'tenant-a', $1 || g, 'fp', '${status}', gen_random_uuid(), ${lease}, ${expires}, ${expires}, now() - interval '1 day'
         FROM generate_series(1, $2::int) g`,
      [prefix, rows],
    );
  };
  const toYesterday = (key: string) =>
    db.query(`UPDATE idempotency_keys SET created_at = created_at - interval '1 day' WHERE key = $1`, [key]);
  /** The partitions from today on, by name. */
  const regular = async () =>
    (
      await db.query(
        `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'idempotency_keys'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
            AND c.relname <> 'idempotency_keys_earlier' ORDER BY 1`,
      )
    ).rows.map((r) => r.relname as string);

  beforeAll(async () => {
    schema = await freshSchema('partition_retention');
    await createTables(schema);
    db = await sqlClient(schema);
    sources = await Promise.all([0, 1].map(() => openDataSource(dataSourceOptions(schema))));
    [store, other] = sources.map((s) => new PostgresIdempotencyStore(s, 'idempotency_keys', { partitioned: true }));
  });
  afterAll(async () => {
    await Promise.all(sources.map((s) => s.destroy()));
    await db.end();
  });
  beforeEach(async () => {
    await db.query('DROP TABLE IF EXISTS idempotency_keys_earlier');
    await db.query(`DO $$ DECLARE today timestamptz := date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00');
      BEGIN EXECUTE format('CREATE TABLE idempotency_keys_earlier PARTITION OF idempotency_keys FOR VALUES FROM (%L) TO (%L)',
                           today - interval '1 day', today); END $$`);
  });

  it('drops a partition whose range is over once every row in it is past its TTL and lease, deleting no row', async () => {
    await seed('gone-', 300, 'expired');
    await seed('dead-', 20, 'dead');
    const before = await regular();
    const result = await store.sweep(SWEEP);
    expect(result).toMatchObject({ ran: true, deleted: 0, partitions: { retired: 1, postponed: false } });
    expect(await exists('idempotency_keys_earlier')).toBe(false);
    expect(await regular()).toEqual(expect.arrayContaining(before));
    // Nothing to delete row by row: the default partition is empty.
    expect(result.batches).toBe(1);
  });

  it('keeps a partition while one row in it is live, and drops it once that row expires', async () => {
    await seed('gone-', 200, 'expired');
    await seed('live-', 1, 'live');
    expect(await store.sweep(SWEEP)).toMatchObject({ deleted: 0, partitions: { retired: 0 } });
    expect(await count('idempotency_keys_earlier')).toBe(201);
    // The live key still replays from the older partition.
    expect((await other.claim(claimRequest('live-1'))).state).toBe('completed');
    // Its TTL runs out (both ends: expires_at, and the floor the retention index reads).
    await db.query(
      `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', expiry_floor = now() - interval '1 second' WHERE key = 'live-1'`,
    );
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 1 } });
    expect(await exists('idempotency_keys_earlier')).toBe(false);
  });

  it('a lease longer than the TTL keeps its partition until the lease ends: a drop never cuts it short', async () => {
    const key = fresh();
    const long = claimRequest(key, { leaseMs: 1_500, ttlMs: 1 });
    expect((await store.claim(long)).state).toBe('claimed');
    await toYesterday(key);
    await seed('gone-', 50, 'expired');
    await sleep(50);
    // Past its TTL, but its lease runs: the key is owned, and its partition stays.
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 0 } });
    expect(await other.claim(claimRequest(key))).toMatchObject({ state: 'in-flight' });
    expect(await store.renewLease(long, 1_500)).toBe(true);
    await sleep(1_000);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 0 } });
    await sleep(1_700);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 1 } });
    // The lease and the TTL are over: the key is absent, and its owner's completion finds nothing.
    expect((await other.claim(claimRequest(key))).state).toBe('claimed');
    expect(await store.complete(long, { status: 201, headers: [], body: null }, 3_600_000)).toBe(false);
  });

  it('a completion that commits while the drop waits for its lock makes the row live: the partition stays', async () => {
    const key = fresh();
    const owner = claimRequest(key, { leaseMs: 1, ttlMs: 1 });
    await store.claim(owner);
    await toYesterday(key);
    await sleep(20);
    // Its lease and TTL ended, but its owner is still finishing: the completion is written, not yet committed.
    const finishing = await sqlClient(schema);
    const retiring = await sqlClient(schema);
    try {
      await finishing.query('BEGIN');
      await finishing.query(`SELECT idempotency_keys_complete('tenant-a', $1, $2, 201, '[]', 'done', 3600000)`, [
        key,
        owner.ownerToken,
      ]);
      // What the committed rows say now: nothing live in the partition, so the drop goes ahead and waits for the lock.
      const retired = retiring.query('SELECT * FROM idempotency_keys_retire_partition(30000)');
      let waiting = false;
      for (let i = 0; i < 500 && !waiting; i++) {
        const { rows } = await db.query(
          `SELECT 1 FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock' AND relation = 'idempotency_keys'::regclass`,
        );
        waiting = rows.length > 0;
        if (!waiting) await sleep(10);
      }
      expect(waiting).toBe(true);
      await finishing.query('COMMIT');
      // Checked again under the lock: the completed row is live, so nothing is dropped.
      expect((await retired).rows).toEqual([]);
    } finally {
      await finishing.end();
      await retiring.end();
    }
    expect(await exists('idempotency_keys_earlier')).toBe(true);
    const replay = await other.claim(claimRequest(key));
    expect(replay.state === 'completed' && replay.response.body?.toString()).toBe('done');
  });

  it('a completion within the slack after its lapsed claim keeps its partition until its own expiry, read exactly', async () => {
    const key = fresh();
    const owner = claimRequest(key, { leaseMs: 1, ttlMs: 1 });
    await store.claim(owner);
    await toYesterday(key);
    await seed('gone-', 20, 'expired');
    await sleep(20);
    // Its claim + TTL and its lease are past; its completion stores the response for 1.5 s more: not far enough
    // past its floor to move it (a HOT update), so the retention index holds an expiry already past.
    expect(await store.complete(owner, { status: 201, headers: [], body: Buffer.from('done') }, 1_500)).toBe(true);
    expect((await db.query(`SELECT expiry_floor < now() AS past FROM idempotency_keys WHERE key = $1`, [key])).rows).toEqual([
      { past: true },
    ]);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 0 } });
    const replay = await other.claim(claimRequest(key));
    expect(replay.state === 'completed' && replay.response.body?.toString()).toBe('done');
    await sleep(1_600);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 1 } });
  });

  it('checks a partition for live rows along its retention index, not by reading it', async () => {
    // A partition about to go: every row long expired but one.
    await seed('gone-', 50_000, 'expired-long-ago');
    await seed('live-', 1, 'live');
    await db.query('ANALYZE idempotency_keys_earlier');
    const { rows } = await db.query(`EXPLAIN ${liveRowQuery('idempotency_keys_earlier')}`);
    const plan = rows.map((row) => row['QUERY PLAN'] as string).join('\n');
    expect(plan.match(/Index (Only )?Scan using idempotency_keys_earlier_greatest_idx/g)).toHaveLength(2);
    expect(plan).not.toMatch(/Seq Scan/);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 0 } });
  });

  it('puts a drop off when a transaction on the key table holds it past the lock timeout, and drops it next run', async () => {
    await seed('gone-', 10, 'expired');
    const busy = await sqlClient(schema);
    try {
      // A request-transaction claim: the handler runs while the transaction holds the key table.
      await busy.query('BEGIN');
      await busy.query(`SELECT * FROM idempotency_keys_claim('tenant-a', $1, 'fp', $2, 30000, 3600000, 1000)`, [
        fresh(),
        randomUUID(),
      ]);
      expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 0, postponed: true } });
      expect(await exists('idempotency_keys_earlier')).toBe(true);
      await busy.query('COMMIT');
    } finally {
      await busy.end();
    }
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { retired: 1, postponed: false } });
  });

  it('claims keep being answered while partitions are retired', async () => {
    await seed('gone-', 5_000, 'expired');
    let done = false;
    const sweeping = store.sweep(SWEEP).finally(() => (done = true));
    let answered = 0;
    const claimer = async (worker: number) => {
      for (let i = 0; !done || i < 10; i++) {
        const claim = await other.claim(claimRequest(`during-${worker}-${i}-${n}`));
        expect(claim.state).toBe('claimed');
        answered++;
      }
    };
    await Promise.all([sweeping, claimer(1), claimer(2)]);
    expect(await sweeping).toMatchObject({ partitions: { retired: 1 } });
    expect(answered).toBeGreaterThanOrEqual(20);
  });

  it('keeps partitions made ahead: the ones missing are made again on the next run', async () => {
    const ahead = await regular();
    expect(ahead.length).toBeGreaterThanOrEqual(4);
    for (const name of ahead.slice(-2)) await db.query(`DROP TABLE ${name}`);
    expect(await store.sweep(SWEEP)).toMatchObject({ partitions: { made: 2 } });
    expect(await regular()).toEqual(ahead);
    const status = await store.partitionStatus(1000);
    expect(status).toMatchObject({ retirable: 0, defaultRows: 0, intervalMs: 86_400_000 });
    expect(status!.aheadMs).toBeGreaterThan(3 * 86_400_000);
  });

  it('uses pg_partman for upkeep where the server has it, with no retention of its own', async () => {
    const available = (await db.query(`SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'`)).rowCount! > 0;
    const { rows } = await db.query(
      `SELECT extnamespace::regnamespace::text AS partman FROM pg_extension WHERE extname = 'pg_partman'`,
    );
    // The test setup creates the extension wherever the server offers it (.ci/run installs Debian's package).
    expect(rows.length > 0).toBe(available);
    if (rows.length > 0) {
      const config = await db.query(
        `SELECT partition_interval, premake, infinite_time_partitions, retention FROM ${rows[0].partman}.part_config WHERE parent_table = $1`,
        [`${schema}.idempotency_keys`],
      );
      expect(config.rows).toEqual([{ partition_interval: '1 day', premake: 4, infinite_time_partitions: true, retention: null }]);
    } else {
      expect(await regular()).toHaveLength(5);
    }
  });
});

/**
 * When nobody runs upkeep for longer than the partitions made ahead last,
 * claims go on: rows land in the default partition, the health check says so,
 * and the next run makes partitions again (after the range whose rows are in
 * the default partition, which those rows keep until they expire and are
 * deleted row by row).
 */
describe('when partition upkeep falls behind', () => {
  let schema: string;
  let db: pg.Client;

  beforeAll(async () => {
    schema = await freshSchema('partition_upkeep_behind');
    await createTables(schema);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await db.end();
  });

  it('claims land in the default partition, the health check is degraded, and the next run catches up', async () => {
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, partitioned: true }),
        IdempotencyHealthModule,
      ],
    })
    class HealthApp {}
    const app = await NestFactory.createApplicationContext(HealthApp, { logger: false });
    try {
      const health = app.get(IdempotencyHealthIndicator);
      const store = app.get(IdempotencyStore) as PostgresIdempotencyStore;
      expect((await health.report()).partitions).toMatchObject({ status: 'up' });

      // Every regular partition gone, as if upkeep had stopped days ago.
      const { rows } = await db.query(
        `SELECT c.oid::regclass::text AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'idempotency_keys'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'`,
      );
      for (const { name } of rows) await db.query(`DROP TABLE ${name}`);
      for (let i = 0; i < 5; i++) {
        const claim = await store.claim({
          tenant: 't',
          key: `behind-${i}`,
          ownerToken: randomUUID(),
          fingerprint: 'fp',
          leaseMs: 30_000,
          ttlMs: 1,
        });
        expect(claim.state).toBe('claimed');
      }
      expect(Number((await db.query('SELECT count(*) FROM ONLY idempotency_keys_default')).rows[0].count)).toBe(5);
      const behind = await health.report();
      expect(behind.status).toBe('degraded');
      expect(behind.partitions).toMatchObject({ status: 'degraded', partitions: { partitions: 0, coversNow: false } });
      // Five, and the health check's own probe claim when it is counted before its release.
      expect(behind.partitions!.partitions!.defaultRows).toBeGreaterThanOrEqual(5);
      expect(behind.partitions!.message).toMatch(/default partition/);

      const caughtUp = await store.sweep(SWEEP);
      // Today's range has rows in the default partition, so it cannot be made; the ones after it can.
      expect(caughtUp.partitions!.made).toBeGreaterThanOrEqual(3);
      const status = (await store.partitionStatus(1000))!;
      expect(status).toMatchObject({ coversNow: false, defaultRows: 5 });
      expect(status.aheadMs).toBeGreaterThan(86_400_000);
      // Their TTL ends, their leases too: the default partition's rows are deleted one by one, as on the plain table.
      await db.query(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second'`);
      expect(await store.sweep(SWEEP)).toMatchObject({ deleted: 5 });
      // (Asked of the store: the health check's own probe claim would land in the default partition too, until released.)
      expect(await store.partitionStatus(1000)).toMatchObject({ defaultRows: 0 });
    } finally {
      await app.close();
    }
  });
});
