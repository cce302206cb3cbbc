import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import pg from 'pg';
import { databaseUrl } from './support/database.js';
import { send, type RawResponse } from './support/http.js';
import { MainProcess } from './support/main-process.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const run = promisify(execFile);
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const DUPLICATES = 8;

type ExampleName = 'prisma' | 'drizzle';

/**
 * The example's tables, made as its README says: Drizzle's by the example's own `migrate` script (drizzle-orm's
 * migrator); Prisma's from its migration's SQL, which `prisma migrate deploy` would run (its schema engine cannot be
 * downloaded here). The key table is the app's to make, at start-up.
 */
const CREATE_APP_TABLES: Record<ExampleName, (url: string) => Promise<unknown>> = {
  prisma: async (url) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query(
        await readFile(join(ROOT, 'examples/prisma/prisma/migrations/20261204000000_payouts/migration.sql'), 'utf8'),
      );
    } finally {
      await client.end();
    }
  },
  drizzle: (url) =>
    run(process.execPath, [join(ROOT, 'test/support/run-typescript.mjs'), 'src/migrate.ts'], {
      cwd: join(ROOT, 'examples/drizzle'),
      env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: url },
    }),
};

/**
 * Each example app (examples/), booted by its own src/main.ts in a process of its own (its imports of
 * nest-idempotency-pg resolve to src/), against a fresh database named by DATABASE_URL, as its README runs it, on
 * the HTTP adapter its HTTP_ADAPTER chooses.
 */
describe.each((['prisma', 'drizzle'] as const).flatMap((example) => ADAPTERS.map((adapter) => [example, adapter] as const)))(
  'examples/%s on %s',
  (example: ExampleName, adapter: AdapterName) => {
    const database = `example_${example}_${adapter}_${process.pid}`;
    const url = new URL(databaseUrl());
    url.pathname = `/${database}`;
    let admin: pg.Client;
    let db: pg.Client;
    let app: MainProcess | undefined;
    let n = 0;
    const fresh = () => `${example}-${adapter}-${Date.now()}-${++n}`;

    beforeAll(async () => {
      admin = new pg.Client({ connectionString: databaseUrl() });
      await admin.connect();
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.query(`CREATE DATABASE "${database}"`);
      db = new pg.Client({ connectionString: url.href });
      await db.connect();
      await CREATE_APP_TABLES[example](url.href);

      app = await MainProcess.start(`examples/${example}`, 'src/main.ts', {
        cwd: join(ROOT, 'examples', example),
        env: { DATABASE_URL: url.href, HTTP_ADAPTER: adapter },
        probePath: '/payouts',
      });
    });

    afterAll(async () => {
      await app?.stop();
      await db?.end();
      if (admin) {
        await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
        await admin.end();
      }
    });

    const pay = (key: string, account: string, amount = 2500): Promise<RawResponse> =>
      send(app!.baseUrl, 'POST', '/payouts', { headers: [['Idempotency-Key', key]], body: { account, amount } });

    /** What committed for the account: its payouts, and the amounts of its ledger entries. */
    async function writesOf(account: string) {
      const payouts = await db.query('SELECT count(*)::int AS n FROM payouts WHERE account = $1', [account]);
      const ledger = await db.query('SELECT amount FROM ledger_entries WHERE account = $1 ORDER BY id', [account]);
      return { payouts: payouts.rows[0].n as number, ledger: ledger.rows.map((row) => row.amount as number) };
    }

    it("pays a new key once: the payout and its ledger entry, through the app's own client, commit with the key", async () => {
      const [key, account] = [fresh(), fresh()];
      const first = await pay(key, account);
      // With the app's log beside the status, so a failure shows why it answered what it did.
      expect({ status: first.status, output: app!.output }).toEqual({ status: 201, output: expect.any(String) });
      expect(first.json()).toEqual({ id: expect.any(Number), account, amount: 2500 });
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      expect(await writesOf(account)).toEqual({ payouts: 1, ledger: [-2500] });
      // The transaction that wrote the payout completed the key: the integration at work, not two commits side by side.
      // (The ledger entry, written in a savepoint, carries its subtransaction's id.)
      const writers = await db.query(
        `SELECT (SELECT xmin::text FROM payouts WHERE account = $1) AS payout,
              (SELECT xmin::text FROM idempotency_keys WHERE key = $2) AS key`,
        [account, key],
      );
      expect(writers.rows[0].key).toBe(writers.rows[0].payout);
    });

    it('runs concurrent duplicates of a new key once: one payout, one ledger entry, the rest 409 or replays', async () => {
      const [key, account] = [fresh(), fresh()];
      const answers = await Promise.all(Array.from({ length: DUPLICATES }, () => pay(key, account, 700)));
      const executed = answers.filter((a) => a.status === 201 && a.headers['idempotent-replayed'] === undefined);
      expect(answers.map((a) => a.status).filter((status) => status !== 201 && status !== 409)).toEqual([]);
      expect(executed).toHaveLength(1);
      expect(await writesOf(account)).toEqual({ payouts: 1, ledger: [-700] });
      // Whichever duplicates were replayed answered the executed one's bytes.
      for (const replay of answers.filter((a) => a.headers['idempotent-replayed'] === 'true')) {
        expect(replay.body.equals(executed[0].body)).toBe(true);
      }
    });

    it('replays a completed key with the same bytes and writes nothing more', async () => {
      const [key, account] = [fresh(), fresh()];
      const first = await pay(key, account, 1200);
      expect(first.status).toBe(201);
      const retry = await pay(key, account, 1200);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body.toString('utf8')).toBe(first.body.toString('utf8'));
      expect(retry.body.equals(first.body)).toBe(true);
      expect(await writesOf(account)).toEqual({ payouts: 1, ledger: [-1200] });
    });
  },
);
