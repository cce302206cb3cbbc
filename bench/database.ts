import { execFileSync } from 'node:child_process';
import { mkdtemp, readdir, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import pg from 'pg';
import { distributeIdempotencyTablesStatements } from '../src/store/citus/citus.sql.js';
import { createTableStatements } from '../src/store/sql.js';

export const KEY_TABLE = 'idempotency_keys';
export const CHARGES_TABLE = 'bench_charges';
/** The realistic handler's other tables (scenario 9): it reads a customer, and writes a ledger entry and an event besides the charge. */
export const CUSTOMERS_TABLE = 'bench_customers';
export const LEDGER_TABLE = 'bench_ledger_entries';
export const EVENTS_TABLE = 'bench_events';
/** The customer every bench request charges; seeded with some others, so the realistic handler's read is an index lookup. */
export const BENCH_CUSTOMER = 'cus_bench';
/** Filled rows are spread over this many tenants, and probe claims pick one of them, so new keys land all over the primary key. */
export const FILL_TENANTS = 100;
/** The tenant of every bench request (the app's resolver answers it; the charges' distribution column defaults to it on Citus). */
export const BENCH_TENANT = 'bench';

/**
 * `BENCH_CITUS=1`: DATABASE_URL is a Citus coordinator (docs/scaling.md). The charges table is distributed by
 * tenant and the module's tables with it (`distributeIdempotencyTables`'s statements), the app runs with
 * `citus: true`, and the PostgreSQL CPU measured is that of every PostgreSQL process of the machine (the
 * coordinator's backends, the workers' backends it opens, their daemons), not only the app's backends.
 */
export const onCitus = (env: NodeJS.ProcessEnv = process.env) => env.BENCH_CITUS === '1';

export interface BenchDatabase {
  url: string;
  embedded: boolean;
  stop(): Promise<void>;
}

/** DATABASE_URL when set; otherwise a real embedded PostgreSQL in a temporary directory, removed on stop. */
export async function openDatabase(log: (line: string) => void): Promise<BenchDatabase> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, embedded: false, stop: async () => undefined };
  const { startEmbeddedPostgres } = await import('../sample-app/embedded-postgres.js');
  const dataDir = await mkdtemp(join(tmpdir(), 'idempotency-bench-pg-'));
  log(`DATABASE_URL is not set: starting an embedded PostgreSQL in ${dataDir}.`);
  const db = await startEmbeddedPostgres({ dataDir, database: 'bench', persistent: false, log });
  return { url: db.url, embedded: true, stop: () => db.stop() };
}

export async function connect(url: string, schema: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, options: `-c search_path=${schema}` });
  await client.connect();
  return client;
}

/** Drops and recreates the bench schema with the library's key table and the handlers' effect table. */
export async function resetSchema(url: string, schema: string): Promise<void> {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.query(`CREATE SCHEMA "${schema}"`);
  } finally {
    await admin.end();
  }
  const client = await connect(url, schema);
  try {
    for (const statement of createTableStatements(KEY_TABLE)) await client.query(statement);
    await client.query(
      onCitus()
        ? // Citus enforces a key only with the distribution column in it; the handlers insert without a tenant.
          `CREATE TABLE ${CHARGES_TABLE} (
          tenant_id text NOT NULL DEFAULT '${BENCH_TENANT}',
          id bigserial,
          amount integer NOT NULL,
          currency text NOT NULL,
          customer text NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now(),
          PRIMARY KEY (tenant_id, id))`
        : `CREATE TABLE ${CHARGES_TABLE} (
      id bigserial PRIMARY KEY,
      amount integer NOT NULL,
      currency text NOT NULL,
      customer text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`,
    );
    await client.query(`CREATE TABLE ${CUSTOMERS_TABLE} (
      id text PRIMARY KEY,
      name text NOT NULL,
      email text NOT NULL,
      risk_level text NOT NULL)`);
    await client.query(
      `INSERT INTO ${CUSTOMERS_TABLE} (id, name, email, risk_level)
       SELECT CASE WHEN g = 1 THEN $1 ELSE 'cus_' || g END, 'Customer ' || g, 'customer' || g || '@example.com', 'normal'
         FROM generate_series(1, 1000) AS g`,
      [BENCH_CUSTOMER],
    );
    await client.query(`CREATE TABLE ${LEDGER_TABLE} (
      id bigserial PRIMARY KEY,
      charge_id bigint NOT NULL,
      customer_id text NOT NULL,
      amount integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
    await client.query(`CREATE TABLE ${EVENTS_TABLE} (
      id bigserial PRIMARY KEY,
      charge_id bigint NOT NULL,
      type text NOT NULL,
      provider_reference text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
    if (onCitus()) {
      await client.query(`SELECT create_distributed_table('${CHARGES_TABLE}', 'tenant_id')`);
      for (const statement of distributeIdempotencyTablesStatements({ tableName: KEY_TABLE, colocateWith: CHARGES_TABLE }))
        await client.query(statement);
    }
  } finally {
    await client.end();
  }
}

/** Empties the tables requests write to, so each adapter starts from the same state. */
export async function truncateAll(client: pg.Client): Promise<void> {
  await client.query(`TRUNCATE ${KEY_TABLE}, ${CHARGES_TABLE}, ${LEDGER_TABLE}, ${EVENTS_TABLE}`);
  await vacuumAnalyze(client);
}

/**
 * Adds `count` completed keys with one `INSERT ... SELECT generate_series`:
 * random UUID keys over FILL_TENANTS tenants (as clients send them), a real
 * SHA-256 fingerprint and a small stored response. `expired` rows are past
 * their TTL (what the sweeper deletes); the others live for about a day.
 */
export async function fillKeys(client: pg.Client, count: number, kind: 'live' | 'expired'): Promise<void> {
  const expiresAt =
    kind === 'live'
      ? `now() + interval '23 hours' + (g % 3600000) * interval '1 millisecond'`
      : `now() - interval '1 minute' - (g % 3600000) * interval '1 millisecond'`;
  await client.query(
    `INSERT INTO ${KEY_TABLE} (tenant_id, key, fingerprint, status, owner_token, attempt, lease_expires_at, expires_at,
                               expiry_floor, created_at, completed_at, response_status, response_headers, response_body)
     SELECT 'tenant-' || (g % ${FILL_TENANTS}), gen_random_uuid()::text, encode(sha256(int8send(g)), 'hex'), 'completed',
            gen_random_uuid(), 1, now() - interval '2 hours', ${expiresAt}, ${expiresAt}, now() - interval '2 hours',
            now() - interval '2 hours',
            201, '[["content-type", "application/json; charset=utf-8"]]'::jsonb,
            convert_to('{"id":"ch_' || g || '","object":"charge","amount":1000,"currency":"usd","customer":"cus_fill","status":"succeeded"}', 'UTF8')
       FROM generate_series(1, $1::int) AS g`,
    [count],
  );
}

/** What a production table that size would have had done to it by autovacuum, done now so it cannot start mid-measurement. */
export async function vacuumAnalyze(client: pg.Client): Promise<void> {
  await client.query(`VACUUM (ANALYZE) ${KEY_TABLE}`);
  for (const table of [CHARGES_TABLE, CUSTOMERS_TABLE, LEDGER_TABLE, EVENTS_TABLE])
    await client.query(`VACUUM (ANALYZE) ${table}`);
}

export async function countKeys(client: pg.Client): Promise<number> {
  return Number((await client.query(`SELECT count(*) AS n FROM ${KEY_TABLE}`)).rows[0].n);
}

export interface ExistingKey {
  tenant: string;
  key: string;
  fingerprint: string;
}

/**
 * Up to `count` live completed keys from random heap pages (a TID lookup per
 * page, so even a 10M-row table is sampled without a scan), for replays.
 */
export async function sampleCompletedKeys(client: pg.Client, count: number): Promise<ExistingKey[]> {
  const pages = Number(
    (await client.query(`SELECT greatest(relpages, 1) AS pages FROM pg_class WHERE oid = $1::regclass`, [KEY_TABLE])).rows[0]
      .pages,
  );
  const tids = Array.from(
    { length: count * 2 },
    () => `(${Math.floor(Math.random() * pages)},${1 + Math.floor(Math.random() * 3)})`,
  );
  const { rows } = await client.query<{ tenant_id: string; key: string; fingerprint: string }>(
    `SELECT tenant_id, key, fingerprint FROM ${KEY_TABLE}
      WHERE ctid = ANY ($1::tid[]) AND status = 'completed' AND expires_at > now() + interval '1 hour'`,
    [tids],
  );
  return rows.slice(0, count).map((r) => ({ tenant: r.tenant_id, key: r.key, fingerprint: r.fingerprint }));
}

export async function serverVersion(client: pg.Client): Promise<string> {
  return String((await client.query('SHOW server_version')).rows[0].server_version);
}

/**
 * CPU time of the PostgreSQL backends serving one application_name, read from
 * /proc. Only meaningful when the server runs on this machine; returns null
 * otherwise (a remote server's pids mean nothing here).
 */
export class BackendCpu {
  private static ticksPerSecond?: number;

  constructor(
    private readonly client: pg.Client,
    private readonly applicationName: string,
  ) {}

  async snapshot(): Promise<Map<number, number> | null> {
    if (onCitus()) return allPostgresCpu();
    const { rows } = await this.client.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [
      this.applicationName,
    ]);
    const cpu = new Map<number, number>();
    for (const { pid } of rows) {
      const ms = await processCpuMs(pid);
      if (ms === null) return null;
      cpu.set(pid, ms);
    }
    return cpu;
  }

  /** CPU ms spent since `before` by the backends alive now (a backend that started meanwhile counts from zero). */
  static since(before: Map<number, number> | null, after: Map<number, number> | null): number | null {
    if (!before || !after) return null;
    let total = 0;
    for (const [pid, ms] of after) total += ms - (before.get(pid) ?? 0);
    return total;
  }

  static get clockTicks(): number {
    if (BackendCpu.ticksPerSecond === undefined) {
      try {
        BackendCpu.ticksPerSecond = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
      } catch {
        BackendCpu.ticksPerSecond = 100;
      }
    }
    return BackendCpu.ticksPerSecond;
  }
}

/** CPU ms of every PostgreSQL process of this machine (Citus: the coordinator, the workers and their daemons). */
async function allPostgresCpu(): Promise<Map<number, number>> {
  const cpu = new Map<number, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const ms = await processCpuMs(Number(entry));
    if (ms !== null) cpu.set(Number(entry), ms);
  }
  return cpu;
}

async function processCpuMs(pid: number): Promise<number | null> {
  try {
    if ((await readFile(`/proc/${pid}/comm`, 'utf8')).trim() !== 'postgres') return null;
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name, which may itself contain spaces: state is [0], utime [11], stime [12].
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / BackendCpu.clockTicks;
  } catch {
    return null;
  }
}

/** What PostgreSQL was doing while a phase ran: sampled wait events of the key-table statements, and WAL written. */
export interface PhaseActivity {
  /** Samples per `statement: wait event` (`statement` is `claim` or `sweep`); statements running on CPU are not counted. */
  waits: Record<string, number>;
  samples: number;
  walBytes: number;
}

/**
 * Samples pg_stat_activity on a connection of its own every few
 * milliseconds: a claim that stalls shows what it waited on (a lock, the
 * WAL writer, I/O), so a latency spike comes with its cause.
 */
export class ActivitySampler {
  private running = false;
  private loop?: Promise<void>;
  private readonly waits = new Map<string, number>();
  private samples = 0;
  private walStart = '0/0';

  constructor(private readonly client: pg.Client) {}

  async start(): Promise<void> {
    this.waits.clear();
    this.samples = 0;
    this.walStart = String((await this.client.query('SELECT pg_current_wal_lsn() AS lsn')).rows[0].lsn);
    this.running = true;
    this.loop = this.sample();
  }

  async stop(): Promise<PhaseActivity> {
    this.running = false;
    await this.loop;
    const { rows } = await this.client.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1) AS bytes', [this.walStart]);
    const waits = Object.fromEntries([...this.waits].sort((a, b) => b[1] - a[1]).slice(0, 8));
    return { waits, samples: this.samples, walBytes: Number(rows[0].bytes) };
  }

  async close(): Promise<void> {
    await this.client.end();
  }

  private async sample(): Promise<void> {
    while (this.running) {
      const { rows } = await this.client.query<{ query: string; wait: string | null }>(
        `SELECT left(btrim(query, E' \\n\\t\\r'), 40) AS query, wait_event_type || ':' || wait_event AS wait
           FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'`,
      );
      this.samples++;
      for (const { query, wait } of rows) {
        // The module's statements open with a marker comment that names them, whatever their SQL.
        const statement = query.startsWith('/* nest-idempotency:claim */')
          ? 'claim'
          : query.startsWith('/* nest-idempotency:sweep-batch */')
            ? 'sweep'
            : undefined;
        if (!statement || !wait) continue;
        const key = `${statement}: ${wait}`;
        this.waits.set(key, (this.waits.get(key) ?? 0) + 1);
      }
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

/** Updates of the key table over one measurement, and how many of them were HOT (heap-only: no index entry written). */
export interface KeyTableUpdates {
  updates: number;
  hot: number;
}

/**
 * Counts the key table's updates (its partitions' too) from
 * `pg_stat_user_tables`: a new key's completion is one, and it is cheap when
 * it is HOT. A busy backend reports these counters at most once a second, so
 * each snapshot waits that long first, as the WAL counter does; one that went
 * idle within a second of its last report waits ten before the next, so a
 * snapshot may miss its last updates (the HOT share of those counted is the
 * measure, not their number).
 */
export class KeyTableUpdateCounter {
  private static readonly STATS_FLUSH_MS = 1_100;

  constructor(private readonly client: pg.Client) {}

  async snapshot(): Promise<KeyTableUpdates> {
    await sleep(KeyTableUpdateCounter.STATS_FLUSH_MS);
    const { rows } = await this.client.query<{ updates: string; hot: string }>(
      `SELECT coalesce(sum(n_tup_upd), 0) AS updates, coalesce(sum(n_tup_hot_upd), 0) AS hot FROM pg_stat_user_tables
        WHERE relid = $1::regclass OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`,
      [KEY_TABLE],
    );
    return { updates: Number(rows[0].updates), hot: Number(rows[0].hot) };
  }

  async since(before: KeyTableUpdates): Promise<KeyTableUpdates> {
    const after = await this.snapshot();
    return { updates: after.updates - before.updates, hot: after.hot - before.hot };
  }
}

/** WAL one measurement wrote (bytes) and flushed to disk (null where the server does not count flushes). */
export interface WalSpent {
  bytes: number;
  flushes: number | null;
}

interface WalSnapshot {
  lsn: string;
  flushes: number | null;
}

/**
 * The WAL a measurement writes and flushes, server-wide: the position of the
 * WAL for bytes, and the cumulative statistics for fsyncs (`pg_stat_wal.wal_sync`
 * up to PostgreSQL 17, `pg_stat_io` for WAL from 18). A commit that waits for
 * its flush shows as one more fsync per request, unless group commit shares one.
 */
export class WalCounter {
  /** Backends report their statistics when idle, at most once a second: waiting that long lets the last ones in. */
  private static readonly STATS_FLUSH_MS = 1_100;
  private flushQuery?: string | null;

  constructor(private readonly client: pg.Client) {}

  async snapshot(): Promise<WalSnapshot> {
    await sleep(WalCounter.STATS_FLUSH_MS);
    const lsn = String((await this.client.query('SELECT pg_current_wal_lsn() AS lsn')).rows[0].lsn);
    return { lsn, flushes: await this.flushes() };
  }

  async since(before: WalSnapshot): Promise<WalSpent> {
    const { rows } = await this.client.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1) AS bytes', [before.lsn]);
    const after = await this.snapshot();
    return {
      bytes: Number(rows[0].bytes),
      flushes: before.flushes === null || after.flushes === null ? null : after.flushes - before.flushes,
    };
  }

  private async flushes(): Promise<number | null> {
    try {
      if (this.flushQuery === undefined) {
        // to_regclass is null (no error) where pg_stat_wal does not exist.
        const { rows } = await this.client.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_attribute WHERE attrelid = to_regclass('pg_catalog.pg_stat_wal') AND attname = 'wal_sync'`,
        );
        this.flushQuery =
          rows[0].n > 0
            ? 'SELECT wal_sync AS n FROM pg_stat_wal'
            : `SELECT sum(fsyncs) AS n FROM pg_stat_io WHERE object = 'wal'`;
      }
      if (this.flushQuery === null) return null;
      const value = (await this.client.query(this.flushQuery)).rows[0]?.n;
      return value === null || value === undefined ? null : Number(value);
    } catch {
      // A server with neither (before 14): bytes only.
      this.flushQuery = null;
      return null;
    }
  }
}
