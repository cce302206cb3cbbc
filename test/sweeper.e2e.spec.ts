import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Module, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule, SchedulerRegistry } from '@nestjs/schedule';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import type { DataSource } from 'typeorm';
import { IdempotencyModule, IdempotencyService, IdempotencySweeper, PostgresIdempotencyStore } from '../src/index.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { keyTableKind, keyTableOptions } from './support/key-table.js';
import { keyUpkeepStatements } from '../src/store/key-upkeep.sql.js';
import { partitionedRetentionStatements } from '../src/store/partitioned/partitioned-key-table.sql.js';

/**
 * When seeded rows were claimed. On the partitioned table, long ago: no
 * partition covers that time, so they sit in the default partition, the one
 * whose expired rows are deleted row by row as the plain table's are (its
 * regular partitions are retired whole: partition-retention.e2e.spec.ts).
 */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const seededAt = () => (keyTableKind() === 'partitioned' ? "now() - interval '10 years'" : 'now()');

/** Inserts `count` rows in one statement; `state` decides what kind. */
async function seed(
  db: pg.Client,
  prefix: string,
  count: number,
  state: 'expired-completed' | 'fresh-completed' | 'expired-in-flight-valid-lease' | 'expired-in-flight-lapsed-lease',
): Promise<void> {
  const [status, lease, expires] = {
    'expired-completed': ['completed', "now() - interval '1 hour'", "now() - interval '1 second'"],
    'fresh-completed': ['completed', "now() - interval '1 hour'", "now() + interval '1 hour'"],
    'expired-in-flight-valid-lease': ['in_flight', "now() + interval '1 minute'", "now() - interval '1 second'"],
    'expired-in-flight-lapsed-lease': ['in_flight', "now() - interval '1 second'", "now() - interval '1 second'"],
  }[state];
  await db.query(
    `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor, response_status,
                                   response_body, created_at)
     SELECT 'tenant', $1 || g, 'fp', '${status}', gen_random_uuid(), ${lease}, ${expires}, ${expires}, 201, '\\x7b7d'::bytea,
            ${seededAt()}
       FROM generate_series(1, $2::int) AS g`,
    [prefix, count],
  );
}

describe('sweeping expired keys', () => {
  let schema: string;
  let db: pg.Client;
  let sources: DataSource[];
  let stores: PostgresIdempotencyStore[];

  beforeAll(async () => {
    schema = await freshSchema('sweeper');
    await createTables(schema);
    db = await sqlClient(schema);
    // Two data sources stand for two app instances.
    sources = await Promise.all([openDataSource(dataSourceOptions(schema)), openDataSource(dataSourceOptions(schema))]);
    stores = sources.map((s) => new PostgresIdempotencyStore(s, 'idempotency_keys', keyTableOptions()));
  });
  afterAll(async () => {
    await Promise.all(sources.map((s) => s.destroy()));
    await db.end();
  });

  const count = async (where = 'true') =>
    Number((await db.query(`SELECT count(*) FROM idempotency_keys WHERE ${where}`)).rows[0].count);

  it('deletes only expired rows and never an in-flight row whose lease is still valid', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'gone-', 30, 'expired-completed');
    await seed(db, 'lapsed-', 20, 'expired-in-flight-lapsed-lease');
    await seed(db, 'live-', 10, 'fresh-completed');
    await seed(db, 'leased-', 5, 'expired-in-flight-valid-lease');
    const result = await stores[0].sweep({ batchSize: 1000, maxDurationMs: 10_000 });
    expect(result).toMatchObject({ ran: true, deleted: 50, batches: 1 });
    expect(await count()).toBe(15);
    expect(await count(`key LIKE 'live-%'`)).toBe(10);
    expect(await count(`key LIKE 'leased-%'`)).toBe(5);
  });

  it('deletes a record once TTL after its response is stored, whatever its claim + TTL, and never one whose lease runs', async () => {
    await db.query('TRUNCATE idempotency_keys');
    const claim = async (key: string, leaseMs: number, ttlMs: number) => {
      const ref = { tenant: 'tenant', key, ownerToken: crypto.randomUUID() };
      expect((await stores[0].claim({ ...ref, fingerprint: 'fp', leaseMs, ttlMs })).state).toBe('claimed');
      // On the partitioned table, into the default partition: the one whose rows are swept (see seededAt).
      if (keyTableKind() === 'partitioned') {
        await db.query(`UPDATE idempotency_keys SET created_at = ${seededAt()} WHERE key = $1`, [key]);
      }
      return ref;
    };
    const answer = { status: 201, headers: [] as Array<[string, string]>, body: Buffer.from('{"id":"ch_1"}') };
    const quick = await claim('quick', 500, 1_000);
    const slow = await claim('slow', 500, 1_000);
    const leased = await claim('leased', 30_000, 1);
    expect(await stores[0].complete(quick, answer, 1_000)).toBe(true);
    // The slow handler stores its response after its claim + TTL: the record lives until TTL after that.
    await sleep(1_200);
    expect(await stores[0].complete(slow, answer, 1_000)).toBe(true);
    await sleep(300);
    expect(await stores[0].sweep({ batchSize: 100, maxDurationMs: 10_000 })).toMatchObject({ deleted: 1 });
    expect(await count(`key = 'quick'`)).toBe(0);
    expect(await count(`key = 'slow'`)).toBe(1);
    const replay = await stores[1].claim({
      tenant: 'tenant',
      key: 'slow',
      ownerToken: crypto.randomUUID(),
      fingerprint: 'fp',
      leaseMs: 500,
      ttlMs: 1_000,
    });
    expect(replay.state === 'completed' && replay.response.body?.toString()).toBe('{"id":"ch_1"}');
    await sleep(1_000);
    expect(await stores[0].sweep({ batchSize: 100, maxDurationMs: 10_000 })).toMatchObject({ deleted: 1 });
    expect(await count(`key = 'slow'`)).toBe(0);
    // Past its TTL long since, but its lease runs: never deleted.
    expect(await count(`key = 'leased'`)).toBe(1);
    expect(
      await stores[1].claim({ ...leased, ownerToken: crypto.randomUUID(), fingerprint: 'fp', leaseMs: 500, ttlMs: 1_000 }),
    ).toMatchObject({
      state: 'in-flight',
    });
  });

  it('finds expired rows along the expiry_floor index, not by reading the table', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'live-', 50_000, 'fresh-completed');
    await seed(db, 'gone-', 500, 'expired-completed');
    await db.query('ANALYZE idempotency_keys');
    const plan = async (statement: string, params: unknown[]) =>
      (await db.query(`EXPLAIN ${statement}`, params)).rows.map((row) => row['QUERY PLAN'] as string).join('\n');
    if (keyTableKind() === 'partitioned') {
      // Regular partitions are retired whole; the default partition's rows go along its retention index.
      const sql = partitionedRetentionStatements('"idempotency_keys"');
      for (const statement of [
        sql.sweepDefault('idempotency_keys_default'),
        sql.countExpiredDefault('idempotency_keys_default'),
      ]) {
        const used = await plan(statement, [500]);
        expect(used).toMatch(/Index (Only )?Scan using idempotency_keys_default_greatest_idx/);
        expect(used).not.toMatch(/Seq Scan/);
      }
    } else {
      const sql = keyUpkeepStatements('"idempotency_keys"');
      for (const [statement, params] of [
        [sql.sweepBatch, [500, '-infinity']],
        [sql.countExpired, [500]],
      ] as const) {
        const used = await plan(statement, [...params]);
        expect(used).toMatch(/Index Scan using idempotency_keys_expiry_floor_idx/);
        expect(used).not.toMatch(/Seq Scan/);
      }
    }
    expect(await stores[0].sweep({ batchSize: 1000, maxDurationMs: 10_000 })).toMatchObject({ deleted: 500 });
  });

  it('never deletes more than a batch per statement, and stops when its time budget is spent', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'b-', 1050, 'expired-completed');
    const tight = await stores[0].sweep({ batchSize: 100, maxDurationMs: 1 });
    expect(tight).toMatchObject({ ran: true, batches: 1, deleted: 100 });
    const rest = await stores[0].sweep({ batchSize: 100, maxDurationMs: 10_000 });
    expect(rest).toMatchObject({ ran: true, deleted: 950, batches: 10 });
    expect(await count()).toBe(0);
  });

  it('a duty cycle below 1 rests between batches in proportion to their cost', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'd-', 4000, 'expired-completed');
    const flat = await stores[0].sweep({ batchSize: 500, maxDurationMs: 60_000, dutyCycle: 1 });
    await seed(db, 'e-', 4000, 'expired-completed');
    const paced = await stores[0].sweep({ batchSize: 500, maxDurationMs: 60_000, dutyCycle: 0.25 });
    expect(flat).toMatchObject({ deleted: 4000, batches: 9, restedMs: 0 });
    expect(paced).toMatchObject({ deleted: 4000, batches: 9 });
    // At a quarter duty it rests three times as long as each full batch took (not after the last, partial one).
    const working = paced.durationMs - paced.restedMs;
    expect(paced.restedMs).toBeGreaterThan(0);
    expect(paced.restedMs).toBeLessThanOrEqual(3 * working + 1);
  });

  it('holds back no VACUUM while it runs: its lock transaction keeps no snapshot between batches', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'x-', 3000, 'expired-completed');
    // Long rests between small batches, so the lock transaction is seen idle between them.
    const sweeping = stores[0].sweep({ batchSize: 100, maxDurationMs: 60_000, dutyCycle: 0.2 });
    let done = false;
    void sweeping.finally(() => (done = true));
    const horizons: Array<string | null> = [];
    while (!done) {
      const { rows } = await db.query<{ xmin: string | null }>(
        `SELECT backend_xmin::text AS xmin FROM pg_stat_activity
          WHERE datname = current_database() AND state = 'idle in transaction' AND query LIKE '%pg_try_advisory_xact_lock%'`,
      );
      horizons.push(...rows.map((row) => row.xmin));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect((await sweeping).deleted).toBe(3000);
    expect(horizons.length).toBeGreaterThan(0);
    // A held xmin would keep every row the sweep deletes (in any table of the database) from being vacuumed until it ends.
    expect(horizons.filter((xmin) => xmin !== null)).toEqual([]);
  });

  it('moves along the expiry order batch after batch, past the rows it must keep, and deletes every expired row', async () => {
    await db.query('TRUNCATE idempotency_keys');
    // Rows the sweep must keep (valid leases) expired first, at the front of the order; the expired ones after them,
    // several sharing each expiry instant, so batches end in the middle of one.
    await seed(db, 'held-', 300, 'expired-in-flight-valid-lease');
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor, response_status,
                                     created_at)
       SELECT 'tenant', 'old-' || g, 'fp', 'completed', gen_random_uuid(), now() - interval '1 hour', expiry, expiry, 201,
              ${seededAt()}
         FROM generate_series(1, 4000) AS g,
              LATERAL (SELECT date_trunc('second', now()) - interval '10 minutes' + (g / 7) * interval '1 millisecond') AS e (expiry)`,
    );
    await seed(db, 'live-', 50, 'fresh-completed');
    const result = await stores[0].sweep({ batchSize: 250, maxDurationMs: 60_000 });
    expect(result).toMatchObject({ ran: true, deleted: 4000, batches: 17 });
    expect(await count(`key LIKE 'old-%'`)).toBe(0);
    expect(await count(`key LIKE 'held-%'`)).toBe(300);
    expect(await count(`key LIKE 'live-%'`)).toBe(50);
  });

  it('two instances sweeping at once: one works, the other stands aside', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'c-', 60_000, 'expired-completed');
    const [a, b] = await Promise.all(stores.map((s) => s.sweep({ batchSize: 500, maxDurationMs: 60_000 })));
    expect([a.ran, b.ran].sort()).toEqual([false, true]);
    expect(a.deleted + b.deleted).toBe(60_000);
    expect((a.ran ? b : a).deleted).toBe(0);
    expect(await count()).toBe(0);
  });

  it('removes 200k expired rows while concurrent claims keep being answered', async () => {
    await db.query('TRUNCATE idempotency_keys');
    await seed(db, 'old-', 200_000, 'expired-completed');
    const sweeping = stores[0].sweep({ batchSize: 2000, maxDurationMs: 120_000 });
    let answered = 0;
    let done = false;
    void sweeping.finally(() => (done = true));
    // Claims on fresh keys and on keys being swept, from the other instance, for as long as the sweep runs.
    const claimer = async (worker: number) => {
      for (let i = 0; !done || i < 20; i++) {
        const key = i % 2 === 0 ? `new-${worker}-${i}` : `old-${(worker - 1) * 60_000 + i + 1}`;
        const claim = await stores[1].claim({
          tenant: 'tenant',
          key,
          ownerToken: crypto.randomUUID(),
          fingerprint: 'fp2',
          leaseMs: 30_000,
          ttlMs: 3_600_000,
        });
        expect(claim.state).toBe('claimed');
        answered++;
      }
    };
    await Promise.all([sweeping, claimer(1), claimer(2), claimer(3)]);
    const result = await sweeping;
    console.log(
      `swept ${result.deleted} rows in ${result.batches} batches, ${result.durationMs} ms; ${answered} claims answered meanwhile`,
    );
    expect(result.ran).toBe(true);
    expect(answered).toBeGreaterThanOrEqual(60);
    expect(await count(`expires_at <= now()`)).toBe(0);
    expect(await count(`status = 'in_flight'`)).toBe(answered);
  }, 180_000);

  it('sets expires_at from the database clock: TTL after the claim, and again after completion', async () => {
    const ref = { tenant: 't', key: 'ttl', ownerToken: crypto.randomUUID() };
    await stores[0].claim({ ...ref, fingerprint: 'fp', leaseMs: 1000, ttlMs: 60_000 });
    const claimed = (
      await db.query(
        `SELECT extract(epoch FROM expires_at - created_at) AS ttl, extract(epoch FROM lease_expires_at - created_at) AS lease FROM idempotency_keys WHERE key = 'ttl'`,
      )
    ).rows[0];
    expect(Number(claimed.ttl)).toBeCloseTo(60, 3);
    expect(Number(claimed.lease)).toBeCloseTo(1, 3);
    await stores[0].complete(ref, { status: 200, headers: [], body: null }, 120_000);
    const completed = (
      await db.query(`SELECT extract(epoch FROM expires_at - completed_at) AS ttl FROM idempotency_keys WHERE key = 'ttl'`)
    ).rows[0];
    expect(Number(completed.ttl)).toBeCloseTo(120, 3);
  });

  it('takes the sweep lock per table: a same-named key table in another schema sweeps meanwhile', async () => {
    const other = await freshSchema('sweeper_other_schema');
    await createTables(other);
    const otherSource = await openDataSource(dataSourceOptions(other));
    const holder = await sqlClient(schema);
    try {
      // What a sweep of this schema's table holds while it runs.
      await holder.query('BEGIN');
      await holder.query(
        "SELECT pg_advisory_xact_lock(hashtextextended('nest-idempotency:sweep:' || to_regclass('\"idempotency_keys\"')::oid::text, 0))",
      );
      const options = { batchSize: 10, maxDurationMs: 1_000 };
      expect((await stores[0].sweep(options)).ran).toBe(false);
      const otherStore = new PostgresIdempotencyStore(otherSource, 'idempotency_keys', keyTableOptions());
      expect((await otherStore.sweep(options)).ran).toBe(true);
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
      await otherSource.destroy();
    }
  });
});

describe('the scheduled sweeper', () => {
  class CapturingLogger implements LoggerService {
    lines: string[] = [];
    log(message: unknown) {
      this.lines.push(String(message));
    }
    error() {}
    warn() {}
    debug() {}
    verbose() {}
  }

  it('runs on its interval, logs one line per run, and exposes its last figures', async () => {
    const schema = await freshSchema('sweeper_scheduled');
    await createTables(schema);
    const db = await sqlClient(schema);
    await seed(db, 'x-', 25, 'expired-completed');
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        ScheduleModule.forRoot(),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: { interval: 150, batchSize: 10 }, ...keyTableOptions() }),
      ],
    })
    class Scheduled {}
    const logger = new CapturingLogger();
    const app = await NestFactory.createApplicationContext(Scheduled, { logger });
    try {
      const sweeper = app.get(IdempotencySweeper);
      // One line per run, from the first: the first run takes the 25 keys, any later one (every 150 ms, however
      // slowly this test gets to look) finds none, so the first line is read, not whichever run was last.
      const swept = () => logger.lines.filter((line) => line.startsWith('Swept '));
      const deadline = Date.now() + 20_000;
      while (swept().length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      const [first, ...later] = swept();
      expect(first).toMatch(/^Swept 25 expired keys in 3 batches, \d+ ms \(\d+ ms resting\)\.$/);
      for (const line of later) expect(line).toMatch(/^Swept 0 expired keys in 1 batches, /);
      // The last figures are the last run's: read with its line, in one go (both are written in one step).
      const [last, { ran, deleted, batches, durationMs, restedMs }] = [swept().at(-1), sweeper.lastRun!];
      expect(ran).toBe(true);
      expect(last).toBe(`Swept ${deleted} expired keys in ${batches} batches, ${durationMs} ms (${restedMs} ms resting).`);
      expect(Number((await db.query('SELECT count(*) FROM idempotency_keys')).rows[0].count)).toBe(0);
      expect(app.get(SchedulerRegistry).getIntervals()).toContain('nest-idempotency:sweep:idempotency_keys');
    } finally {
      await app.close();
      await db.end();
    }
  });

  it('with sweep: false nothing is scheduled, and IdempotencyService.sweep() runs it on demand', async () => {
    const schema = await freshSchema('sweeper_manual');
    await createTables(schema);
    const db = await sqlClient(schema);
    await seed(db, 'y-', 7, 'expired-completed');
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        ScheduleModule.forRoot(),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, ...keyTableOptions() }),
      ],
    })
    class Manual {}
    const app = await NestFactory.createApplicationContext(Manual, { logger: false });
    try {
      expect(app.get(SchedulerRegistry).getIntervals()).toEqual([]);
      await new Promise((r) => setTimeout(r, 200));
      expect(Number((await db.query('SELECT count(*) FROM idempotency_keys')).rows[0].count)).toBe(7);
      expect(await app.get(IdempotencyService).sweep()).toMatchObject({ ran: true, deleted: 7 });
    } finally {
      await app.close();
      await db.end();
    }
  });
});
