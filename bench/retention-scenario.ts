import { createHash, randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { DEFAULT_LEASE_MS, DEFAULT_SWEEP_DUTY_CYCLE, DEFAULT_TTL_MS } from '../src/idempotency.constants.js';
import type { PostgresIdempotencyStore } from '../src/index.js';
import { createPartitionedTableStatements } from '../src/store/partitioned/partitioned-key-table.sql.js';
import { createTableStatements } from '../src/store/sql.js';
import { openStore, probeClaims } from './claims.js';
import type { BenchConfig } from './config.js';
import { ActivitySampler, connect, FILL_TENANTS, KEY_TABLE, sampleCompletedKeys, type ExistingKey } from './database.js';
import type { ObservedProbe } from './db-scenarios.js';
import { round } from './stats.js';

export type KeyTableKind = 'plain' | 'partitioned';

/** Table and index bytes, summed over the partitions of a partitioned table. */
export interface TableBytes {
  rows: number;
  tableBytes: number;
  indexBytes: number;
}

export interface RetentionRun {
  kind: KeyTableKind;
  /** Partitions attached after the fill, the default one included (0 for the plain table). */
  partitions: number;
  fillSeconds: number;
  /** Claims per second from `workers` concurrent loops, new keys and replays, on the filled table. */
  throughput: { workers: number; newKeysPerSecond: number; replaysPerSecond: number };
  /**
   * The claim function alone, called in a loop by one backend (a procedure, a
   * commit after each claim): its own server cost, without the client, the
   * pool or the network, so the least noisy comparison of the two tables.
   */
  serverLoop: { claims: number; newKeysPerSecond: number; replaysPerSecond: number };
  idle: ObservedProbe;
  duringRetention: ObservedProbe;
  retention: {
    retiredKeys: number;
    durationMs: number;
    /** WAL of the retention run, less what the probe's claims wrote meanwhile (at their idle rate). */
    walBytes: number;
    /** WAL and time of the VACUUM that follows (what autovacuum would do after it). */
    vacuumWalBytes: number;
    vacuumMs: number;
    walBytesPerRetiredKey: number;
  };
  sizes: { filled: TableBytes; afterRetention: TableBytes; afterVacuum: TableBytes; afterChurn: TableBytes };
}

export interface RetentionResult {
  /** Keys of each day: a day past its TTL, a day live, and the next day's inserts. */
  keysPerDay: number;
  runs: RetentionRun[];
}

/**
 * Scenario 14: retention by DELETE (the plain table's sweeper) against
 * retention by dropping a partition, at the same churn. Each table gets two
 * days of keys: one day claimed the day before yesterday, past its TTL, and
 * one day claimed within the last 24 hours, live. Retention then retires the
 * expired day (the sweeper deletes it in batches at the module's pacing; the
 * partitioned table drops its partition) while claims are probed at a fixed
 * rate; then VACUUM runs, and the next day's keys are inserted: the table as
 * it stands after a day's churn.
 */
export async function runRetention(config: BenchConfig, url: string, log: (line: string) => void): Promise<RetentionResult> {
  const keysPerDay = Math.max(1_000, Math.floor(config.retentionRows / 2));
  const runs: RetentionRun[] = [];
  // The partitioned table's retention is over in a moment: its claims are probed for as long as the plain table's
  // DELETE took to retire the same keys, so both p99s cover the same span of the same churn.
  let windowMs = config.claimSeconds * 1000;
  for (const kind of ['plain', 'partitioned'] as const) {
    log(`  ${kind} table, ${(2 * keysPerDay).toLocaleString('en')} keys (two days):`);
    const run = await runOne(kind, keysPerDay, windowMs, config, url, log);
    windowMs = Math.max(windowMs, run.retention.durationMs);
    runs.push(run);
  }
  return { keysPerDay, runs };
}

async function runOne(
  kind: KeyTableKind,
  keysPerDay: number,
  windowMs: number,
  config: BenchConfig,
  url: string,
  log: (line: string) => void,
): Promise<RetentionRun> {
  const schema = `${config.schema}_retention`;
  const db = await connect(url, 'public');
  await db.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await forgetPartman(db, schema);
  await db.query(`CREATE SCHEMA "${schema}"`);
  await db.query(`SET search_path = "${schema}"`);
  const statements =
    kind === 'plain'
      ? createTableStatements(KEY_TABLE)
      : createPartitionedTableStatements(KEY_TABLE, { interval: '1 day', premake: 4, partman: 'auto' });
  for (const statement of statements) await db.query(statement);
  if (kind === 'partitioned') {
    // The days before today, as upkeep would have made them.
    await db.query(`DO $$ DECLARE today timestamptz := date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00');
      BEGIN FOR d IN 1..3 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF ${KEY_TABLE} FOR VALUES FROM (%L) TO (%L)',
          '${KEY_TABLE}_p' || to_char((today - d * interval '1 day') AT TIME ZONE 'UTC', 'YYYY_MM_DD'),
          today - d * interval '1 day', today - (d - 1) * interval '1 day');
      END LOOP; END $$`);
  }
  const fillStarted = performance.now();
  // The expired day: claimed the day before yesterday (UTC), completed, past its TTL since yesterday.
  await fill(db, keysPerDay, `date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00') - interval '2 days'`);
  // The live day: claimed over the last 24 hours.
  await fill(db, keysPerDay, `now() - interval '24 hours'`);
  const fillSeconds = round((performance.now() - fillStarted) / 1000, 1);
  await db.query(`VACUUM (ANALYZE) ${KEY_TABLE}`);
  const partitions = Number(
    (await db.query(`SELECT count(*) AS n FROM pg_inherits WHERE inhparent = '${KEY_TABLE}'::regclass`)).rows[0].n,
  );
  const filled = await sizes(db);
  log(`    filled in ${fillSeconds} s: ${describeBytes(filled)}${partitions ? `, ${partitions} partitions` : ''}`);

  const { store, close } = await openStore(url, schema, 8, { partitioned: kind === 'partitioned' });
  const sampler = new ActivitySampler(await connect(url, schema));
  try {
    const existing = await liveKeys(db, Math.min(20_000, config.claimRate * (config.claimSeconds + config.claimWarmupSeconds)));
    await probeClaims(store, existing, { rate: config.claimRate, seconds: config.claimWarmupSeconds });
    const throughput = await closedLoop(store, existing, 8, Math.max(2, Math.ceil(config.claimSeconds / 2)));
    log(
      `    claims/s with 8 workers: new keys ${throughput.newKeysPerSecond.toLocaleString('en')}, ` +
        `replays ${throughput.replaysPerSecond.toLocaleString('en')}`,
    );
    const serverLoop = await claimLoop(db, existing, 5_000);
    log(
      `    the claim function in a loop, one backend: new keys ${serverLoop.newKeysPerSecond.toLocaleString('en')}/s, ` +
        `replays ${serverLoop.replaysPerSecond.toLocaleString('en')}/s`,
    );
    await sampler.start();
    const idleProbe = await probeClaims(store, existing, { rate: config.claimRate, seconds: config.claimSeconds });
    const idle = { ...idleProbe, activity: await sampler.stop() };
    log(`    idle:             ${describe(idle)}`);

    // Retention while the probe runs: the sweeper's run as the module schedules it (default batch size and pacing).
    let result: Awaited<ReturnType<PostgresIdempotencyStore['sweep']>> | undefined;
    let retentionMs = 0;
    await sampler.start();
    const retiring = (async () => {
      await sleep(1_000);
      const started = performance.now();
      result = await store.sweep({
        batchSize: config.sweepBatchSize,
        maxDurationMs: 6 * 60 * 60 * 1000,
        dutyCycle: Number(process.env.BENCH_SWEEP_DUTY_CYCLE ?? DEFAULT_SWEEP_DUTY_CYCLE),
      });
      retentionMs = performance.now() - started;
      // The probe runs for `windowMs` at least, so a short retention is measured over as many claims.
      await sleep(Math.max(0, windowMs - retentionMs - 1_000));
    })();
    const duringProbe = await probeClaims(store, existing, { rate: config.claimRate, until: retiring });
    await retiring;
    const duringRetention = { ...duringProbe, activity: await sampler.stop() };
    const retiredKeys = kind === 'plain' ? result!.deleted : result!.partitions!.retiredKeys + result!.deleted;
    const probeWalPerSecond = idle.activity.walBytes / idle.seconds;
    const walBytes = Math.max(0, Math.round(duringRetention.activity.walBytes - probeWalPerSecond * duringRetention.seconds));
    log(`    during retention: ${describe(duringRetention)}`);
    const afterRetention = await sizes(db);

    const vacuum = await walOf(db, () => db.query(`VACUUM ${KEY_TABLE}`));
    const afterVacuum = await sizes(db);
    // The next day's keys: claimed from now on, where the expired day's space (plain) or partition (partitioned) was.
    await fill(db, keysPerDay, 'now()');
    await db.query(`VACUUM (ANALYZE) ${KEY_TABLE}`);
    const afterChurn = await sizes(db);
    const retention = {
      retiredKeys,
      durationMs: Math.round(retentionMs),
      walBytes,
      vacuumWalBytes: vacuum.bytes,
      vacuumMs: vacuum.ms,
      walBytesPerRetiredKey: retiredKeys > 0 ? round((walBytes + vacuum.bytes) / retiredKeys, 1) : 0,
    };
    log(
      `    retired ${retiredKeys.toLocaleString('en')} keys in ${(retentionMs / 1000).toFixed(1)} s, WAL ${mb(walBytes)} ` +
        `+ VACUUM ${mb(vacuum.bytes)} in ${(vacuum.ms / 1000).toFixed(1)} s: ${retention.walBytesPerRetiredKey} bytes per retired key`,
    );
    log(
      `    sizes: after retention ${describeBytes(afterRetention)}; after VACUUM ${describeBytes(afterVacuum)}; ` +
        `after the next day's keys ${describeBytes(afterChurn)}`,
    );
    return {
      kind,
      partitions,
      fillSeconds,
      throughput,
      serverLoop,
      idle,
      duringRetention,
      retention,
      sizes: { filled, afterRetention, afterVacuum, afterChurn },
    };
  } finally {
    await close();
    await sampler.close();
    await db.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await forgetPartman(db, schema);
    await db.end();
  }
}

/** `count` completed keys claimed uniformly over the 24 hours from `from`, each expiring a TTL (24 h) after its claim. */
async function fill(db: pg.Client, count: number, from: string): Promise<void> {
  await db.query(
    `INSERT INTO ${KEY_TABLE} (tenant_id, key, fingerprint, status, owner_token, attempt, lease_expires_at, expires_at,
                               expiry_floor, created_at, completed_at, response_status, response_headers, response_body)
     SELECT 'tenant-' || (g % ${FILL_TENANTS}), gen_random_uuid()::text, encode(sha256(int8send(g)), 'hex'), 'completed',
            gen_random_uuid(), 1, at + interval '30 seconds', at + interval '24 hours', at + interval '24 hours', at, at,
            201, '[["content-type", "application/json; charset=utf-8"]]'::jsonb,
            convert_to('{"id":"ch_' || g || '","object":"charge","amount":1000,"currency":"usd","customer":"cus_fill","status":"succeeded"}', 'UTF8')
       FROM (SELECT g, ${from} + (g::float8 / $1) * interval '24 hours' AS at FROM generate_series(0, $1::int - 1) AS g) AS days`,
    [count],
  );
}

/** Live keys to replay, sampled from random pages of each partition (or of the table). */
async function liveKeys(db: pg.Client, count: number): Promise<ExistingKey[]> {
  const { rows } = await db.query<{ tenant_id: string; key: string; fingerprint: string }>(
    `SELECT tenant_id, key, fingerprint FROM ${KEY_TABLE} TABLESAMPLE SYSTEM (5)
      WHERE status = 'completed' AND expires_at > now() + interval '1 hour' LIMIT $1`,
    [count],
  );
  if (rows.length > 0) return rows.map((r) => ({ tenant: r.tenant_id, key: r.key, fingerprint: r.fingerprint }));
  return sampleCompletedKeys(db, count);
}

async function sizes(db: pg.Client): Promise<TableBytes> {
  const { rows } = await db.query<{ table_bytes: string; index_bytes: string; rows: string }>(
    `SELECT sum(pg_table_size(leaf)) AS table_bytes, sum(pg_indexes_size(leaf)) AS index_bytes,
            (SELECT count(*) FROM ${KEY_TABLE}) AS rows
       FROM (SELECT relid AS leaf FROM pg_partition_tree('${KEY_TABLE}') WHERE isleaf
             UNION ALL SELECT oid FROM pg_class WHERE oid = '${KEY_TABLE}'::regclass AND relkind = 'r') AS leaves`,
  );
  return { rows: Number(rows[0].rows), tableBytes: Number(rows[0].table_bytes), indexBytes: Number(rows[0].index_bytes) };
}

async function walOf(db: pg.Client, work: () => Promise<unknown>): Promise<{ bytes: number; ms: number }> {
  const before = String((await db.query('SELECT pg_current_wal_lsn() AS lsn')).rows[0].lsn);
  const started = performance.now();
  await work();
  const ms = Math.round(performance.now() - started);
  const { rows } = await db.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1) AS bytes', [before]);
  return { bytes: Number(rows[0].bytes), ms };
}

/** Claims as fast as `workers` loops go for `seconds`: new keys, then replays of `existing`. */
async function closedLoop(store: PostgresIdempotencyStore, existing: ExistingKey[], workers: number, seconds: number) {
  const rate = async (replay: boolean) => {
    let done = 0;
    const until = performance.now() + seconds * 1000;
    await Promise.all(
      Array.from({ length: workers }, async (_, w) => {
        for (let i = w; performance.now() < until; i += workers) {
          const key = randomUUID();
          const target = replay
            ? existing[i % existing.length]
            : { tenant: `tenant-${i % FILL_TENANTS}`, key, fingerprint: createHash('sha256').update(key).digest('hex') };
          await store.claim({ ...target, ownerToken: randomUUID(), leaseMs: DEFAULT_LEASE_MS, ttlMs: DEFAULT_TTL_MS });
          done++;
        }
      }),
    );
    return Math.round(done / seconds);
  };
  return { workers, newKeysPerSecond: await rate(false), replaysPerSecond: await rate(true) };
}

/** `claims` calls of the claim function by one backend, each committed (as the module commits each claim), new keys then replays. */
async function claimLoop(db: pg.Client, existing: ExistingKey[], claims: number) {
  const replays = existing.slice(0, 1_000);
  await db.query(`CREATE TABLE bench_replay_keys (n integer PRIMARY KEY, tenant text, key text, fingerprint text)`);
  await db.query(
    `INSERT INTO bench_replay_keys SELECT row_number() OVER () - 1, r.tenant, r.key, r.fingerprint
       FROM jsonb_to_recordset($1::jsonb) AS r(tenant text, key text, fingerprint text)`,
    [JSON.stringify(replays)],
  );
  await db.query(`CREATE PROCEDURE bench_claim_loop(p_replay boolean, p_claims integer) LANGUAGE plpgsql AS $$
    DECLARE k record;
    BEGIN
      FOR i IN 1..p_claims LOOP
        IF p_replay THEN
          SELECT * INTO k FROM bench_replay_keys WHERE bench_replay_keys.n = i % ${Math.max(1, replays.length)};
          PERFORM * FROM ${KEY_TABLE}_claim(k.tenant, k.key, k.fingerprint, gen_random_uuid(), 30000, 86400000, NULL);
        ELSE
          PERFORM * FROM ${KEY_TABLE}_claim('tenant-' || (i % ${FILL_TENANTS}), gen_random_uuid()::text, md5(i::text),
                                           gen_random_uuid(), 30000, 86400000, NULL);
        END IF;
        COMMIT;
      END LOOP;
    END $$`);
  await db.query('SET synchronous_commit = off');
  const rate = async (replay: boolean) => {
    const started = performance.now();
    await db.query('CALL bench_claim_loop($1, $2)', [replay, claims]);
    return Math.round(claims / ((performance.now() - started) / 1000));
  };
  try {
    return { claims, newKeysPerSecond: await rate(false), replaysPerSecond: await rate(true) };
  } finally {
    await db.query('RESET synchronous_commit');
    await db.query('DROP PROCEDURE bench_claim_loop(boolean, integer)');
    await db.query('DROP TABLE bench_replay_keys');
  }
}

async function forgetPartman(db: pg.Client, schema: string): Promise<void> {
  const { rows } = await db.query<{ partman: string | null }>(
    `SELECT extnamespace::regnamespace::text AS partman FROM pg_extension WHERE extname = 'pg_partman'`,
  );
  if (rows[0]?.partman) {
    await db.query(`DELETE FROM ${rows[0].partman}.part_config WHERE split_part(parent_table, '.', 1) = $1`, [schema]);
  }
}

function describe(probe: ObservedProbe): string {
  const f = (n: number) => n.toFixed(2);
  return (
    `new key p50 ${f(probe.newKeys.p50)} / p99 ${f(probe.newKeys.p99)} ms, replay p50 ${f(probe.replays.p50)} / p99 ` +
    `${f(probe.replays.p99)} ms, max ${f(Math.max(probe.newKeys.max, probe.replays.max))} ms ` +
    `(${probe.newKeys.count + probe.replays.count} claims in ${probe.seconds} s` +
    `${probe.unexpected ? `, ${probe.unexpected} unexpected` : ''}), WAL ${mb(probe.activity.walBytes)}`
  );
}

function describeBytes(bytes: TableBytes): string {
  return `${bytes.rows.toLocaleString('en')} rows, table ${mb(bytes.tableBytes)}, indexes ${mb(bytes.indexBytes)}`;
}

function mb(bytes: number): string {
  const value = bytes / 1024 / 1024;
  return `${value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString('en')} MB`;
}
