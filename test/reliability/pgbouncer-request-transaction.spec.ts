import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { createTableStatements } from '../../src/store/sql.js';
import { databaseUrl } from '../support/database.js';
import { post, sleep } from '../support/http.js';
import { keyLockProbe } from '../support/key-lock.js';
import { ADAPTERS, startTestApp, type TestApp } from '../support/test-app.js';
import { PgBouncer } from './support/pgbouncer.js';

const TABLE = 'idempotency_keys';
const DATABASE = `${new URL(databaseUrl()).pathname.slice(1)}_bouncer_rtx`.slice(0, 60);

/**
 * request-transaction mode through PgBouncer in transaction pooling. On one server's plain table its claim holds the
 * key's lock for the session as well as the transaction (so that a stored failure needs no savepoint), and never
 * lets the connection go idle with it: every hold is let go of inside a transaction. PgBouncer lends a server
 * connection for a transaction and takes it back when it ends; a hold that outlived a transaction would stay on a
 * server connection PgBouncer then lends to anyone, and keep the key locked for as long as that connection lives.
 *
 * Two app instances, both adapters, through one PgBouncer with a small pool (so server connections are shared
 * between requests of both), and the lock checked from a direct connection to the server.
 */
describe('request-transaction mode through PgBouncer in transaction pooling', () => {
  let bouncer: PgBouncer;
  let db: pg.Client;
  const url = Object.assign(new URL(databaseUrl()), { pathname: `/${DATABASE}` }).toString();
  let n = 0;

  beforeAll(async () => {
    const admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    try {
      await admin.query(`DROP DATABASE IF EXISTS "${DATABASE}" WITH (FORCE)`);
      await admin.query(`CREATE DATABASE "${DATABASE}"`);
    } finally {
      await admin.end();
    }
    db = new pg.Client({ connectionString: url });
    await db.connect();
    for (const statement of createTableStatements(TABLE)) await db.query(statement);
    await db.query(`CREATE TABLE effects (
      id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
    await db.query(`CREATE FUNCTION judge_effect() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.label LIKE 'refuse-%' THEN RAISE EXCEPTION 'effect refused at commit' USING ERRCODE = '23514'; END IF;
        RETURN NULL;
      END $$`);
    await db.query(`CREATE CONSTRAINT TRIGGER judge_effect AFTER INSERT ON effects
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION judge_effect()`);
    // Fewer server connections than the two instances' pools: requests of both share them.
    bouncer = await PgBouncer.start(url, { poolSize: 3 });
  });
  afterAll(async () => {
    await db?.end();
    await bouncer?.stop();
    const admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS "${DATABASE}" WITH (FORCE)`);
    await admin.end();
  });

  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const expectKeyFree = (key: string) => keyLockProbe(db, TABLE).expectKeyFree(key);
  /** Advisory locks of the key functions' kind held by any backend, granted. */
  const advisoryHolds = async () =>
    Number(
      (await db.query(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted`)).rows[0].count,
    );
  describe.each(ADAPTERS)('over %s', (adapter) => {
    let one: TestApp;
    let two: TestApp;
    const fresh = (kind: string) => `${kind}-${adapter}-${Date.now()}-${++n}`;

    beforeAll(async () => {
      one = await startTestApp(adapter, 'public', {}, { url: bouncer.url, poolSize: 4 });
      two = await startTestApp(adapter, 'public', {}, { url: bouncer.url, poolSize: 4 });
    });
    afterAll(async () => {
      await one?.close();
      await two?.close();
    });

    it('concurrent duplicates of a stored 4xx on two instances: the handler ran once, its writes rolled back, every duplicate replays it', async () => {
      const label = fresh('decline');
      one.probe.delays.set(label, [500]);
      const original = post(one.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
      for (let i = 0; i < 500 && one.probe.count(label) === 0; i++) await sleep(10);
      const duplicates = await Promise.all(
        Array.from({ length: 4 }, (_, i) => post((i % 2 ? one : two).url, '/in-tx', { label, fail: 'decline' }, `k-${label}`)),
      );
      const first = await original;
      expect(first.status).toBe(402);
      for (const duplicate of duplicates) {
        // A duplicate that found the key in flight and gave up waiting answers 409; none runs the handler again.
        expect([402, 409]).toContain(duplicate.status);
        if (duplicate.status === 402) expect(duplicate.text()).toBe(first.text());
      }
      expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
      expect(await effects(label)).toBe(0);
      await expectKeyFree(`k-${label}`);
    });

    it('leaves no lock on any server connection after every ending, and the next request on that connection is not held up', async () => {
      const endings: Array<[string, Record<string, unknown>, number]> = [
        ['ok', {}, 201],
        ['decline', { fail: 'decline' }, 402],
        ['sqldecline', { fail: 'sql-decline' }, 402],
        ['boom', { fail: 'boom' }, 500],
        ['swallowed', { fail: 'sql-swallowed' }, 500],
        ['refuse', {}, 500],
      ];
      for (const [kind, extra, status] of endings) {
        const label = `${kind === 'refuse' ? 'refuse-' : ''}${fresh(kind)}`;
        const answer = await post(one.url, '/in-tx', { label, ...extra }, `k-${label}`);
        expect({ kind, status: answer.status }).toEqual({ kind, status });
        await expectKeyFree(`k-${label}`);
        const retry = await post(two.url, '/in-tx', { label, ...extra }, `k-${label}`);
        expect({ kind, status: retry.status }).toEqual({ kind, status });
        await expectKeyFree(`k-${label}`);
        expect(await effects(label)).toBe(kind === 'ok' ? 1 : 0);
      }
      // Every server connection PgBouncer holds is free of the module's holds, whoever it was lent to last.
      for (let i = 0; i < 200 && (await advisoryHolds()) > 0; i++) await sleep(10);
      expect(await advisoryHolds()).toBe(0);
    });

    it('a burst of keys, each sent twice at once, over both instances and the shared server connections: one run and one effect per key, no hold left', async () => {
      const labels = Array.from({ length: 12 }, () => fresh('burst'));
      const answers = await Promise.all(
        labels.flatMap((label) => [one, two].map((app) => post(app.url, '/in-tx', { label }, `k-${label}`))),
      );
      for (const answer of answers) expect([201, 409]).toContain(answer.status);
      for (const label of labels) {
        expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
        expect(await effects(label)).toBe(1);
      }
      for (let i = 0; i < 200 && (await advisoryHolds()) > 0; i++) await sleep(10);
      expect(await advisoryHolds()).toBe(0);
    });
  });
});
