import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { DataSource, DataSourceOptions, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import type { ClaimMode, ClaimRequest } from '../src/core/idempotency-store.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { dataSourceOptions, openDataSource } from './support/database.js';
import { sleep } from './support/http.js';
import { claimRequest } from './support/key-table.js';
import { ThrowawayPostgres } from './support/throwaway-postgres.js';

const JSON_TYPE: Array<[string, string]> = [['content-type', 'application/json']];

/**
 * What the key store promises beyond the rows it writes (issue 26, items 4,
 * 6 and 7), on a PostgreSQL server of this file's own, never the shared one,
 * whose settings stay as they are: a claim the work has begun on outlives a
 * crash of the server (CONTRACT A3.5b); the server's own log, with its
 * default settings, carries no key, tenant, owner token or body, and an
 * ordinary 409 is no database error there (A5.12); no value of a request
 * leaves its place in a statement, whatever the session's encoding.
 */
describe('a server of its own: a crash, its log, a session in SJIS', () => {
  let server: ThrowawayPostgres;

  beforeAll(async () => {
    server = await ThrowawayPostgres.start('crash_and_log', { wal_writer_delay: '10s' });
  });
  afterAll(async () => {
    await server?.stop();
  });

  /**
   * The server runs with `wal_writer_delay = 10s`: a commit that does not
   * wait for its WAL flush (`synchronous_commit = off`) sits in the WAL
   * buffers for up to ten seconds, and a crash of the server's processes
   * loses it. (It also runs with `fsync = off`, which only matters to a
   * crash of the machine: WAL handed to the kernel survives the crash of a
   * process.)
   */
  describe('a claim outlives a crash of the database server (A3.5b)', () => {
    beforeAll(() => server.createKeySchema('crash'));

    it('a separate claim, the server crashed at once, restarted: the key is there with its generation, and the retry after the lease gets that same generation', async () => {
      const open = () => openDataSource(dataSourceOptions('crash', { url: server.url() }));
      const dataSource = await open();
      const request = claimRequest(`crash-${randomUUID()}`, { leaseMs: 300 });
      let generation: string | undefined;
      try {
        const store = new PostgresIdempotencyStore(dataSource, 'idempotency_keys');
        const begun = await store.begin(request, 'separate');
        expect(begun.claim.state).toBe('claimed');
        generation = begun.claim.state === 'claimed' ? begun.claim.generation : undefined;
        // The handler runs now, and may already have called a provider with a key derived from `generation`, when
        // the database server crashes: nothing else has committed since the claim (a later synchronous commit would
        // flush the claim's WAL with its own).
        await server.crash();
        await begun.attempt?.rollback(false).catch(() => undefined);
      } finally {
        await dataSource.destroy().catch(() => undefined);
      }
      await server.restart();

      const reopened = await open();
      try {
        const [row] = (await reopened.query('SELECT generation, status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', [
          request.tenant,
          request.key,
        ])) as Array<{ generation: string; status: string }>;
        // The crashed attempt's lease (300 ms from the claim, by the database clock) has lapsed: a retry takes over.
        await sleep(request.leaseMs);
        const store = new PostgresIdempotencyStore(reopened, 'idempotency_keys');
        const retry = await store.begin({ ...request, ownerToken: randomUUID() }, 'separate');
        await retry.attempt?.rollback(false);
        expect({
          row,
          retry:
            retry.claim.state === 'claimed' ? { attempt: retry.claim.attempt, generation: retry.claim.generation } : retry.claim,
        }).toEqual({
          row: { generation, status: 'in_flight' },
          // The same generation: a provider called with a key derived from it deduplicates the retry's call.
          retry: { attempt: 2, generation },
        });
      } finally {
        await reopened.destroy();
      }
    });
  });

  describe("PostgreSQL's own log, with its default settings (A5.12)", () => {
    const schema = 'server_log';
    let dataSource: DataSource;
    /** Every owner token the store was given: the fencing tokens, which the log must not carry either. */
    const ownerTokens = new Set<string>();
    /** The store of two processes, recording the owner token of each claim. */
    class RecordingStore extends PostgresIdempotencyStore {
      override begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs?: number) {
        ownerTokens.add(request.ownerToken);
        return super.begin(request, mode, lockTimeoutMs);
      }
      override claim(request: ClaimRequest, tx?: EntityManager, lockTimeoutMs?: number) {
        ownerTokens.add(request.ownerToken);
        return super.claim(request, tx, lockTimeoutMs);
      }
    }

    beforeAll(async () => {
      await server.createKeySchema(schema);
      dataSource = await openDataSource(dataSourceOptions(schema, { url: server.url() }));
    });
    afterAll(async () => {
      await dataSource?.destroy();
    });

    it('after ordinary traffic in both claim modes the log holds no key, tenant, owner token or body, and no request-transaction 409 is an ERROR', async () => {
      const settings = (await dataSource.query(
        `SELECT current_setting('log_min_error_statement') AS statement, current_setting('log_min_messages') AS messages,
                current_setting('log_parameter_max_length_on_error') AS parameters`,
      )) as Array<Record<string, string>>;
      expect(settings[0]).toEqual({ statement: 'error', messages: 'warning', parameters: '0' });

      // Every key, tenant and body carries `secret`: none of it may reach the log.
      const secret = `secret-${randomUUID()}`;
      const tenant = `${secret}-tenant`;
      const store = new RecordingStore(dataSource, 'idempotency_keys');
      // Two processes: a duplicate sent to the other one is answered through the database, not from memory.
      const [one, two] = [new IdempotencyEngine(store), new IdempotencyEngine(store)];
      const started = new Set<string>();
      const body = (name: string, bytes = 0) =>
        Buffer.from(JSON.stringify({ note: `${secret}-body-${name}`, padding: 'p'.repeat(bytes) }));
      const work = (
        name: string,
        claimMode: ClaimMode,
        over: {
          delayMs?: number;
          leaseMs?: number;
          waitMs?: number;
          fingerprint?: string;
          fails?: 'keep' | 'store';
          bytes?: number;
        } = {},
      ) => ({
        tenant,
        key: `${secret}-key-${name}`,
        fingerprint: over.fingerprint ?? 'fp',
        leaseMs: over.leaseMs ?? 30_000,
        ttlMs: 3_600_000,
        claimMode,
        waitMs: over.waitMs ?? 0,
        heartbeat: false,
        onFailure: () =>
          over.fails === 'store'
            ? {
                action: 'store' as const,
                response: { status: 402, headers: JSON_TYPE, body: body(name) },
              }
            : { action: 'keep' as const },
        run: async (tx: EntityManager) => {
          started.add(name);
          await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [tenant, `${secret}-effect-${name}`]);
          await sleep(over.delayMs ?? 0);
          if (over.fails) throw new Error(`declined ${secret}`);
          return {
            response: {
              status: 201,
              headers: JSON_TYPE,
              body: body(name, over.bytes),
            },
            result: name,
          };
        },
      });
      const outcome = (running: Promise<{ kind: string }>) =>
        running.then(
          (done) => done.kind,
          (error: Error) => error.name,
        );
      const whenStarted = async (name: string) => {
        for (let i = 0; i < 500 && !started.has(name); i++) await sleep(10);
      };

      const from = server.logOffset();
      const answers: Record<string, string> = {};
      // New keys in both modes, then their replays and a different body under each key (422) on the other process.
      for (const mode of ['separate', 'request-transaction'] as const) {
        answers[`new ${mode}`] = await outcome(one.execute(work(mode, mode)));
        answers[`replay ${mode}`] = await outcome(two.execute(work(mode, mode)));
        answers[`other body ${mode}`] = await outcome(two.execute(work(mode, mode, { fingerprint: 'other' })));
      }
      // Bodies over 64 KiB, in both modes, replayed.
      for (const mode of ['separate', 'request-transaction'] as const) {
        answers[`large ${mode}`] = await outcome(one.execute(work(`large-${mode}`, mode, { bytes: 70 * 1024 })));
        answers[`large replay ${mode}`] = await outcome(two.execute(work(`large-${mode}`, mode)));
      }
      // Failures the handler throws: kept (rolled back), and stored as a definite answer (a 402), in both modes.
      for (const mode of ['separate', 'request-transaction'] as const) {
        answers[`failure kept ${mode}`] = await outcome(one.execute(work(`kept-${mode}`, mode, { fails: 'keep' })));
        answers[`failure stored ${mode}`] = await outcome(one.execute(work(`stored-${mode}`, mode, { fails: 'store' })));
        answers[`failure replay ${mode}`] = await outcome(two.execute(work(`stored-${mode}`, mode)));
      }

      // Duplicates of a running request-transaction attempt: one that does not wait, one that waits past its
      // bound for the key's lock, and one of the other mode. The server's log of just this stretch is read.
      const beforeConflicts = server.logOffset();
      const busy = one.execute(work('busy', 'request-transaction', { delayMs: 800 }));
      await whenStarted('busy');
      answers['409 no wait'] = await outcome(two.execute(work('busy', 'request-transaction')));
      answers['409 waited 100 ms'] = await outcome(two.execute(work('busy', 'request-transaction', { waitMs: 100 })));
      answers['409 separate'] = await outcome(two.execute(work('busy', 'separate')));
      answers['busy'] = await outcome(busy);
      const duringConflicts = await server.logSince(beforeConflicts);

      // A lease lost: a separate attempt outlives its 300 ms lease, another process takes the key over, and the
      // first attempt's completion is fenced.
      const hung = one.execute(work('hung', 'separate', { leaseMs: 300, delayMs: 1_200 }));
      await whenStarted('hung');
      await sleep(600);
      answers['takeover'] = await outcome(two.execute(work('hung', 'separate')));
      answers['hung'] = await outcome(hung);

      const log = await server.logSince(from);
      const rows = (await dataSource.query('SELECT owner_token, generation FROM idempotency_keys WHERE tenant_id = $1', [
        tenant,
      ])) as Array<{ owner_token: string; generation: string | null }>;
      for (const row of rows) for (const token of [row.owner_token, row.generation]) if (token) ownerTokens.add(token);

      expect(ownerTokens.size).toBeGreaterThan(10);
      // The fenced completion is a failing statement of the module, logged with its text: the log was read.
      const statements = log.split('\n').filter((line) => /STATEMENT:.*nest-idempotency:/.test(line));
      expect(statements.length).toBeGreaterThan(0);
      expect({
        // The one database error of all this traffic: the fenced completion of the attempt that lost its lease.
        errors: log.split('\n').flatMap((line) => /ERROR:\s+(.*)/.exec(line)?.slice(1) ?? []),
        secrets: log.split('\n').filter((line) => line.includes(secret)),
        ownerTokens: [...ownerTokens].filter((token) => log.includes(token)),
        errorsDuring409s: duringConflicts.split('\n').filter((line) => /ERROR:|STATEMENT:/.test(line)),
        // After the fenced completion the COMMIT sent with it already ended the transaction: no second ROLLBACK.
        warnings: log.split('\n').flatMap((line) => /WARNING:\s+(.*)/.exec(line)?.slice(1) ?? []),
      }).toEqual({
        warnings: [],
        errors: ["the idempotency key is no longer this attempt's"],
        secrets: [],
        ownerTokens: [],
        errorsDuring409s: [],
      });
      // Each of the above was what it was meant to be.
      expect(answers).toEqual({
        'new separate': 'executed',
        'replay separate': 'replayed',
        'other body separate': 'FingerprintMismatchError',
        'new request-transaction': 'executed',
        'replay request-transaction': 'replayed',
        'other body request-transaction': 'FingerprintMismatchError',
        'large separate': 'executed',
        'large replay separate': 'replayed',
        'large request-transaction': 'executed',
        'large replay request-transaction': 'replayed',
        'failure kept separate': 'Error',
        'failure stored separate': 'failure-stored',
        'failure replay separate': 'replayed',
        'failure kept request-transaction': 'Error',
        'failure stored request-transaction': 'failure-stored',
        'failure replay request-transaction': 'replayed',
        '409 no wait': 'KeyInFlightError',
        '409 waited 100 ms': 'KeyInFlightError',
        '409 separate': 'KeyInFlightError',
        busy: 'executed',
        takeover: 'executed',
        hung: 'LeaseLostError',
      });
    });
  });

  /**
   * A session whose `client_encoding` is SJIS, with `backslash_quote = on`
   * (without it the server refuses `\'` in a client-only encoding). In SJIS
   * the bytes 0x81-0x9F and 0xE0-0xFC open a two-byte character whose second
   * byte may be 0x5C, the backslash. node-postgres sends UTF-8 whatever the
   * session says, and the server reads it as SJIS: the UTF-8 of `Ö` (0xC3
   * 0x96) reads as a one-byte katakana and a lead byte, which takes the
   * backslash after it. A value escaped into a literal character by
   * character (`Ö\'` as `E'Ö\\'''`) loses its first backslash that way; the
   * second escapes a quote, the next quote ends the literal, and the rest of
   * the value is SQL. Sent as a parameter, the same bytes are only a value.
   */
  describe('a session in SJIS with backslash_quote = on: no value leaves its place (issue 26, item 7)', () => {
    const database = 'sjis_session';
    let dataSource: DataSource;
    /** A plain UTF8 session on the database, to look at the canary table. */
    let plain: pg.Client;

    /**
     * node-postgres names UTF8 in every startup packet, which outranks a
     * `-c client_encoding` in `options` and ALTER ROLE or DATABASE settings:
     * a session reaches SJIS only by a SET on it, as an app's connection hook
     * would do. Each connection of the data source's pool does it first.
     */
    class SjisClient extends pg.Client {
      override connect(): Promise<pg.Client>;
      override connect(callback: ((error: Error) => void) | ((error: null, client: pg.Client) => void)): void;
      override connect(
        callback?: ((error: Error) => void) | ((error: null, client: pg.Client) => void),
      ): Promise<pg.Client> | void {
        const connected = super.connect().then(async () => {
          await this.query("SET client_encoding TO 'SJIS'");
          return this;
        });
        if (!callback) return connected;
        connected.then(
          (client) => (callback as (error: null, client: pg.Client) => void)(null, client),
          (error: Error) => (callback as (error: Error) => void)(error),
        );
      }
    }

    beforeAll(async () => {
      const admin = await server.client();
      // A UTF8 database, whatever the locale the server was made with: the server converts what an SJIS session sends.
      await admin
        .query(`CREATE DATABASE ${database} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
        .finally(() => admin.end());
      await server.createKeySchema('public', database);
      plain = await server.client(database);
      const options = dataSourceOptions('public', { url: server.url(database) }) as DataSourceOptions & {
        extra: Record<string, unknown>;
      };
      dataSource = await openDataSource({
        ...options,
        extra: { ...options.extra, options: '-c search_path=public -c backslash_quote=on', Client: SjisClient },
      } as DataSourceOptions);
    });
    afterAll(async () => {
      await dataSource?.destroy();
      await plain?.end();
    });

    it('the data source speaks SJIS with backslash_quote = on, on every connection', async () => {
      const runners = await Promise.all(
        [0, 1, 2].map(async () => {
          const runner = dataSource.createQueryRunner();
          await runner.connect();
          return runner;
        }),
      );
      try {
        const seen = await Promise.all(
          runners.map(async (runner) => {
            const [row] = (await runner.query(
              `SELECT current_setting('client_encoding') AS encoding, current_setting('backslash_quote') AS backslash_quote`,
            )) as Array<Record<string, string>>;
            return row;
          }),
        );
        expect(seen).toEqual(runners.map(() => ({ encoding: 'SJIS', backslash_quote: 'on' })));
      } finally {
        await Promise.all(runners.map((runner) => runner.release()));
      }
    });

    /**
     * `Ö\'` then the rest of the claim function's call, written to close it
     * (`WHERE false`: never run), then the table dropped and committed, and
     * the rest of the statement commented out: what a value escaped into a
     * literal would execute.
     */
    const crafted = (valuesAfter: number) =>
      `Ö\\', ${Array.from({ length: valuesAfter }, () => 'NULL').join(', ')}) WHERE false; DROP TABLE canary; COMMIT; --`;

    it.each([
      { field: 'key', claimMode: 'separate' as const, tenant: 'tenant-sjis', key: crafted(5) },
      { field: 'tenant', claimMode: 'request-transaction' as const, tenant: crafted(6), key: 'key-sjis' },
    ])(
      'a crafted $field ($claimMode) is stored and replayed as given, runs its work once, and drops nothing',
      async ({ claimMode, tenant, key }) => {
        await plain.query('CREATE TABLE IF NOT EXISTS public.canary (id integer)');
        const store = new PostgresIdempotencyStore(dataSource, 'idempotency_keys');
        const [one, two] = [new IdempotencyEngine(store), new IdempotencyEngine(store)];
        const work = {
          tenant,
          key,
          fingerprint: 'fp',
          leaseMs: 30_000,
          ttlMs: 3_600_000,
          claimMode,
          heartbeat: false,
          onFailure: () => ({ action: 'keep' as const }),
          run: async (tx: EntityManager) => {
            await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [tenant, key]);
            return { response: { status: 201, headers: [], body: Buffer.from(`done ${claimMode}`) }, result: 'done' };
          },
        };
        const outcome = (engine: IdempotencyEngine<EntityManager>) =>
          engine.execute(work).then(
            (done) => ({ kind: done.kind, body: done.response.body?.toString() }),
            (error: Error) => ({ kind: error.name, body: undefined }),
          );
        const first = await outcome(one);
        const second = await outcome(two);

        const canary = (await plain.query(`SELECT to_regclass('public.canary') IS NOT NULL AS present`)).rows[0].present;
        const effects = (await dataSource.query('SELECT count(*)::int AS count FROM effects WHERE tenant = $1 AND label = $2', [
          tenant,
          key,
        ])) as Array<{ count: number }>;
        // Read back through an SJIS session, the stored tenant and key are the ones given. (A UTF8 session reads
        // what the server made of the UTF-8 bytes it took for SJIS: `Ö\` is stored as two other characters.)
        const stored = (await dataSource.query(
          'SELECT tenant_id, key, status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2',
          [tenant, key],
        )) as Array<{ tenant_id: string; key: string; status: string }>;
        expect({ canary, first, second, effects: effects[0].count, stored }).toEqual({
          canary: true,
          first: { kind: 'executed', body: `done ${claimMode}` },
          second: { kind: 'replayed', body: `done ${claimMode}` },
          effects: 1,
          stored: [{ tenant_id: tenant, key, status: 'completed' }],
        });
      },
    );
  });
});
