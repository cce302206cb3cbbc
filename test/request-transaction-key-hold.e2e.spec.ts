import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import { keyLock } from '../src/store/key-function-parts.sql.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTableStatements } from '../src/store/sql.js';
import { createTables, databaseUrl, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { keyLockProbe } from './support/key-lock.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TABLE = 'idempotency_keys';

/**
 * request-transaction mode on one server's plain table holds the key's lock
 * for the claim's session as well as its transaction, so that a failure
 * whose answer is stored can roll the work back (ROLLBACK AND CHAIN) and
 * complete the key with no savepoint and no moment at which a waiting
 * duplicate finds the key free. What that must never do: leave the lock on
 * a connection that goes back to the pool, where it would block the key for
 * as long as the connection lives. After every kind of ending, a claim of the
 * same key from another connection gets the lock at once, and no backend
 * holds it.
 *
 * Under READ COMMITTED (the test database) and under REPEATABLE READ as the
 * database's default (a database of its own), on both adapters, with two app
 * instances on one database standing for two processes.
 */
const SETTINGS = [
  { name: 'read committed', ownDatabase: false },
  { name: 'repeatable read', ownDatabase: true },
] as const;

describe.each(ADAPTERS)('the request-transaction key hold over %s', (adapter) => {
  describe.each(SETTINGS)('when the database defaults to $name', (setting) => {
    let one: TestApp;
    let two: TestApp;
    let db: pg.Client;
    let n = 0;
    const fresh = (kind: string) => `${kind}-${adapter}-${setting.name.replace(' ', '-')}-${Date.now()}-${++n}`;
    const database = `${new URL(databaseUrl()).pathname.slice(1)}_hold_rr_${adapter}`.slice(0, 60);
    const url = setting.ownDatabase
      ? Object.assign(new URL(databaseUrl()), { pathname: `/${database}` }).toString()
      : databaseUrl();
    const effects = async (label: string) =>
      Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
    const holders = (key: string) => keyLockProbe(db, TABLE).holders(key);
    const lockableAtOnce = (key: string) => keyLockProbe(db, TABLE).lockableAtOnce(key);
    const expectKeyFree = (key: string) => keyLockProbe(db, TABLE).expectKeyFree(key);
    const started = async (app: TestApp, label: string) => {
      for (let i = 0; i < 500 && app.probe.count(label) === 0; i++) await sleep(10);
      expect(app.probe.count(label)).toBeGreaterThan(0);
    };

    beforeAll(async () => {
      let schema = 'public';
      if (setting.ownDatabase) {
        const admin = new pg.Client({ connectionString: databaseUrl() });
        await admin.connect();
        try {
          await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
          await admin.query(`CREATE DATABASE "${database}"`);
          await admin.query(`ALTER DATABASE "${database}" SET default_transaction_isolation = '${setting.name}'`);
        } finally {
          await admin.end();
        }
        db = new pg.Client({ connectionString: url });
        await db.connect();
        for (const statement of createTableStatements(TABLE)) await db.query(statement);
        await db.query(`CREATE TABLE effects (
          id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
      } else {
        schema = await freshSchema(`rtx_hold_${adapter}`);
        await createTables(schema);
        db = await sqlClient(schema);
      }
      // The test's own reads must see what committed, whatever the database's default.
      await db.query(`SET default_transaction_isolation = 'read committed'`);
      await db.query(`CREATE FUNCTION judge_effect() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.label LIKE 'refuse-%' THEN RAISE EXCEPTION 'effect refused at commit' USING ERRCODE = '23514'; END IF;
          RETURN NULL;
        END $$`);
      await db.query(`CREATE CONSTRAINT TRIGGER judge_effect AFTER INSERT ON effects
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION judge_effect()`);
      one = await startTestApp(adapter, schema, {}, { url });
      two = await startTestApp(adapter, schema, {}, { url });
    });
    afterAll(async () => {
      await one?.close();
      await two?.close();
      await db?.end();
    });

    it('the database default is the one the test means', async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        const { rows } = await client.query<{ level: string }>(`SELECT current_setting('transaction_isolation') AS level`);
        expect(rows[0].level).toBe(setting.name);
      } finally {
        await client.end();
      }
    });

    it('concurrent duplicates of a stored 4xx on two instances: the handler ran once, its writes rolled back, every duplicate replays the 4xx', async () => {
      const label = fresh('decline');
      one.probe.delays.set(label, [500]);
      const original = post(one.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
      await started(one, label);
      const duplicates = await Promise.all(
        Array.from({ length: 6 }, (_, i) => post((i % 2 ? one : two).url, '/in-tx', { label, fail: 'decline' }, `k-${label}`)),
      );
      const first = await original;
      expect(first.status).toBe(402);
      for (const duplicate of duplicates) {
        expect(duplicate.status).toBe(402);
        expect(duplicate.headers['idempotent-replayed']).toBe('true');
        expect(duplicate.text()).toBe(first.text());
      }
      expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
      expect(await effects(label)).toBe(0);
      expect(
        (await db.query('SELECT status, response_status FROM idempotency_keys WHERE key = $1', [`k-${label}`])).rows,
      ).toEqual([{ status: 'completed', response_status: 402 }]);
      await expectKeyFree(`k-${label}`);
    });

    it('a handler whose SQL error aborted its transaction, then a 4xx: stored and final for a waiting duplicate', async () => {
      const label = fresh('sqldecline');
      one.probe.delays.set(label, [500]);
      const original = post(one.url, '/in-tx', { label, fail: 'sql-decline' }, `k-${label}`);
      await started(one, label);
      const duplicate = await post(two.url, '/in-tx', { label, fail: 'sql-decline' }, `k-${label}`);
      const first = await original;
      expect(first.status).toBe(402);
      expect(duplicate.status).toBe(402);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
      expect(await effects(label)).toBe(0);
      await expectKeyFree(`k-${label}`);
      // And later retries replay it too.
      const later = await post(two.url, '/in-tx', { label, fail: 'sql-decline' }, `k-${label}`);
      expect(later.status).toBe(402);
      expect(later.headers['idempotent-replayed']).toBe('true');
    });

    it('leaves no lock behind after any ending: success, replay, 4xx stored, 5xx, a swallowed SQL error, a refused COMMIT, a 409', async () => {
      const endings: Array<[string, Record<string, unknown>, number]> = [
        ['ok', {}, 201],
        ['decline', { fail: 'decline' }, 402],
        ['boom', { fail: 'boom' }, 500],
        // The handler answers, but its transaction was aborted: the completion fails, the COMMIT is refused.
        ['swallowed', { fail: 'sql-swallowed' }, 500],
        ['refuse', {}, 500],
      ];
      for (const [kind, extra, status] of endings) {
        const label = `${kind === 'refuse' ? 'refuse-' : ''}${fresh(kind)}`;
        const answer = await post(one.url, '/in-tx', { label, ...extra }, `k-${label}`);
        expect({ kind, status: answer.status }).toEqual({ kind, status });
        await expectKeyFree(`k-${label}`);
        // A retry runs or replays at once, on the other instance.
        const retry = await post(two.url, '/in-tx', { label, ...extra }, `k-${label}`);
        expect({ kind, status: retry.status }).toEqual({ kind, status });
        await expectKeyFree(`k-${label}`);
      }
      // A duplicate that gives up waiting (409) while the original runs, then the original's success.
      const label = fresh('busy');
      one.probe.delays.set(label, [3_600]);
      const original = post(one.url, '/in-tx', { label }, `k-${label}`);
      await started(one, label);
      expect(await holders(`k-${label}`)).toBe(1);
      expect(await lockableAtOnce(`k-${label}`)).toBe(false);
      expect((await post(two.url, '/in-tx', { label }, `k-${label}`)).status).toBe(409);
      expect((await original).status).toBe(201);
      await expectKeyFree(`k-${label}`);
      // Every connection of both instances' pools is idle again, and none holds an advisory lock.
      // (An idle backend, outside any transaction, can hold an advisory lock only at session level.)
      const { rows } = await db.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND a.datname = current_database() AND a.state = 'idle'`,
      );
      expect(rows[0].n).toBe(0);
    });

    it('a connection ended under a running handler frees the key; a retry runs once', async () => {
      const label = fresh('killed');
      one.probe.delays.set(label, [800]);
      const original = post(one.url, '/in-tx', { label }, `k-${label}`);
      await started(one, label);
      const { rows } = await db.query<{ pid: number }>(
        `WITH k AS (SELECT ${keyLock(TABLE, '$1::text', '$2::text')} AS v)
         SELECT DISTINCT pid FROM pg_locks, k
          WHERE locktype = 'advisory' AND objsubid = 1 AND granted
            AND classid::bigint = (k.v >> 32) & 4294967295 AND objid::bigint = k.v & 4294967295`,
        ['tenant-a', `k-${label}`],
      );
      expect(rows).toHaveLength(1);
      await db.query('SELECT pg_terminate_backend($1)', [rows[0].pid]);
      expect((await original).status).toBe(503);
      await expectKeyFree(`k-${label}`);
      const retry = await post(two.url, '/in-tx', { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(await effects(label)).toBe(1);
      await expectKeyFree(`k-${label}`);
    });
  });
});

describe('a request-transaction attempt whose process is killed mid-handler', () => {
  let dataSource: DataSource;
  let schema: string;
  let db: pg.Client;

  beforeAll(async () => {
    schema = await freshSchema('rtx_hold_crash');
    await createTables(schema);
    db = await sqlClient(schema);
    dataSource = await openDataSource(dataSourceOptions(schema));
  });
  afterAll(async () => {
    await dataSource?.destroy();
    await db?.end();
  });

  it('leaves nothing: the retry claims the key and runs once, and no lock is left', async () => {
    const key = `crash-${Date.now()}`;
    const child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/support/request-transaction-crash.ts'], {
      cwd: ROOT,
      env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: databaseUrl(), APP_SCHEMA: schema, CRASH_KEY: key },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
    const running = await new Promise<boolean>((resolve) => {
      createInterface({ input: child.stdout! }).on('line', (line) => line === 'running' && resolve(true));
      void closed.then(() => resolve(false));
    });
    expect({ running, stderr: running ? '' : stderr }).toEqual({ running: true, stderr: '' });
    // The handler wrote its effect and sleeps, its transaction open, holding the key.
    const engine = new IdempotencyEngine<EntityManager>(new PostgresIdempotencyStore(dataSource, TABLE));
    const work = (waitMs: number) => ({
      tenant: 't',
      key,
      fingerprint: 'same',
      leaseMs: 30_000,
      ttlMs: 60_000,
      claimMode: 'request-transaction' as const,
      waitMs,
      heartbeat: false,
      onFailure: () => ({ action: 'keep' as const }),
      run: async (tx: EntityManager) => {
        await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key]);
        return { response: { status: 201, headers: [], body: Buffer.from('retry') }, result: 'retry' };
      },
    });
    await expect(engine.execute(work(0))).rejects.toMatchObject({ name: 'KeyInFlightError' });
    child.kill('SIGKILL');
    await closed;
    // The server notices the closed socket and ends the session, its transaction and every lock with it; the retry
    // (which may wait for that, as a duplicate does) claims the key and runs once.
    await expect(engine.execute(work(5_000))).resolves.toMatchObject({ kind: 'executed' });
    const { rows } = await db.query('SELECT label FROM effects WHERE label = $1', [key]);
    expect(rows).toHaveLength(1);
    const { rows: locks } = await db.query<{ n: number }>(
      `WITH k AS (SELECT ${keyLock(TABLE, '$1::text', '$2::text')} AS v)
       SELECT count(*)::int AS n FROM pg_locks, k
        WHERE locktype = 'advisory' AND objsubid = 1 AND classid::bigint = (k.v >> 32) & 4294967295 AND objid::bigint = k.v & 4294967295`,
      ['t', key],
    );
    expect(locks[0].n).toBe(0);
  });
});
