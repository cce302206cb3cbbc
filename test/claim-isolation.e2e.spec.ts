import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import type { ClaimMode } from '../src/core/idempotency-store.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTableStatements } from '../src/store/sql.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
} from '../src/store/partitioned/partitioned-key-table.sql.js';
import { databaseUrl, openDataSource } from './support/database.js';
import { sleep } from './support/http.js';

/**
 * A stricter isolation level than PostgreSQL's READ COMMITTED, set where many teams set it: as the database's
 * default (`ALTER DATABASE ... SET default_transaction_isolation`), in the connection's options, or on the data
 * source. Whatever sets it, concurrent duplicates reaching several instances (each its own engine, store and pool,
 * so none is answered from another's memory) run the handler once, and every other one replays it: no second run,
 * no serialization failure answered as an error. Each case runs on a database of its own.
 */
const SETTINGS = [
  { name: 'the database defaults to REPEATABLE READ', database: 'repeatable read' },
  { name: 'the database defaults to SERIALIZABLE', database: 'serializable' },
  { name: "the connection's options set REPEATABLE READ", options: '-c default_transaction_isolation=repeatable\\ read' },
  { name: 'the data source sets REPEATABLE READ', isolationLevel: 'REPEATABLE READ' },
  // The work at READ COMMITTED on such a server: the claim opens no transaction, the work's BEGIN is deferred.
  {
    name: 'the database defaults to REPEATABLE READ and the data source sets READ COMMITTED',
    database: 'repeatable read',
    isolationLevel: 'READ COMMITTED',
    workLevel: 'read committed',
  },
] as const;

const INSTANCES = 3;
const DUPLICATES = 10;

describe.each(['plain', 'partitioned'] as const)('the %s key table', (table) => {
  describe.each(SETTINGS)('when $name', (setting) => {
    const database = `iso_${table}_${setting.name.replace(/[^a-z]+/gi, '_').toLowerCase()}`.slice(0, 60);
    const url = Object.assign(new URL(databaseUrl()), { pathname: `/${database}` }).toString();
    let sources: DataSource[] = [];
    let engines: Array<IdempotencyEngine<EntityManager>> = [];
    const started = new Map<string, number>();
    let n = 0;

    beforeAll(async () => {
      const admin = new pg.Client({ connectionString: databaseUrl() });
      await admin.connect();
      try {
        await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
        await admin.query(`CREATE DATABASE "${database}"`);
        if ('database' in setting) {
          await admin.query(`ALTER DATABASE "${database}" SET default_transaction_isolation = '${setting.database}'`);
        }
      } finally {
        await admin.end();
      }
      const ddl = new pg.Client({ connectionString: url });
      await ddl.connect();
      try {
        const statements =
          table === 'partitioned'
            ? createPartitionedTableStatements('idempotency_keys', { ...DEFAULT_PARTITION_LAYOUT, partman: false })
            : createTableStatements('idempotency_keys');
        for (const statement of statements) await ddl.query(statement);
        await ddl.query('CREATE TABLE effects (id bigserial PRIMARY KEY, label text NOT NULL)');
        // The setting is really in force for a plain connection of this database (a test that cannot fail otherwise).
        if ('database' in setting) {
          const { rows } = await ddl.query('SHOW transaction_isolation');
          expect(rows[0].transaction_isolation).toBe(setting.database);
        }
      } finally {
        await ddl.end();
      }
      for (let i = 0; i < INSTANCES; i++) {
        const source = await openDataSource({
          type: 'postgres',
          url,
          extra: { max: 8, connectionTimeoutMillis: 5_000, ...('options' in setting ? { options: setting.options } : {}) },
          ...('isolationLevel' in setting ? { isolationLevel: setting.isolationLevel } : {}),
        } as never);
        sources.push(source);
        engines.push(
          new IdempotencyEngine(
            new PostgresIdempotencyStore(source, 'idempotency_keys', { partitioned: table === 'partitioned' }),
          ),
        );
      }
    });

    afterAll(async () => {
      await Promise.all(sources.map((source) => source.destroy()));
      sources = [];
      engines = [];
      const admin = new pg.Client({ connectionString: databaseUrl() });
      await admin.connect();
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.end();
    });

    /** The key's effects committed, read on a connection of its own. */
    const effects = async (key: string) => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        return (await client.query('SELECT count(*)::int AS count FROM effects WHERE label = $1', [key])).rows[0].count as number;
      } finally {
        await client.end();
      }
    };
    const work = (key: string, claimMode: ClaimMode, delayMs = 150) => ({
      tenant: 't',
      key,
      fingerprint: 'same',
      leaseMs: 30_000,
      ttlMs: 60_000,
      claimMode,
      // Long enough for every duplicate to see the first attempt's answer.
      waitMs: 10_000,
      heartbeat: false,
      onFailure: () => ({ action: 'keep' as const }),
      run: async (tx: EntityManager) => {
        started.set(key, (started.get(key) ?? 0) + 1);
        const [{ level }] = (await tx.query("SELECT current_setting('transaction_isolation') AS level")) as Array<{
          level: string;
        }>;
        await tx.query('INSERT INTO effects (label) VALUES ($1)', [key]);
        await sleep(delayMs);
        return { response: { status: 201, headers: [], body: Buffer.from(level) }, result: level };
      },
    });

    it('claim mode separate: a handler that outlives its lease keeps its key (heartbeat) and completes', async () => {
      const key = `long-${++n}`;
      const long = engines[0].execute({ ...work(key, 'separate', 1_500), leaseMs: 600, heartbeat: true });
      long.catch(() => undefined);
      // Past the first lease: another instance's duplicate finds the key still held, and does not run.
      await sleep(900);
      await expect(engines[1].execute({ ...work(key, 'separate'), leaseMs: 600, waitMs: 0 })).rejects.toMatchObject({
        name: 'KeyInFlightError',
      });
      await expect(long).resolves.toMatchObject({ kind: 'executed' });
      expect(started.get(key)).toBe(1);
      await expect(engines[2].execute({ ...work(key, 'separate'), leaseMs: 600 })).resolves.toMatchObject({ kind: 'replayed' });
    });

    it('claim mode separate: a hung handler gives its key up at maxHold, and a retry on another instance runs', async () => {
      const key = `hung-${++n}`;
      const hung = engines[0].execute({ ...work(key, 'separate', 3_000), leaseMs: 300, maxHoldMs: 600, heartbeat: true });
      hung.catch(() => undefined);
      await sleep(1_000);
      await expect(engines[1].execute({ ...work(key, 'separate'), leaseMs: 300, waitMs: 0 })).resolves.toMatchObject({
        kind: 'executed',
      });
      await expect(hung).rejects.toMatchObject({ name: 'LeaseLostError' });
      expect(started.get(key)).toBe(2);
      expect(await effects(key)).toBe(1);
    });

    // The partitioned table cannot keep request-transaction mode's promise under a stricter level (see the next test).
    const modes = table === 'partitioned' ? (['separate'] as const) : (['separate', 'request-transaction'] as const);

    it.each(modes)(
      'claim mode %s: concurrent duplicates on several instances run the handler once; the others replay it',
      async (claimMode) => {
        for (let burst = 0; burst < 3; burst++) {
          const key = `${claimMode}-${++n}`;
          const outcomes = await Promise.allSettled(
            Array.from({ length: DUPLICATES }, (_, i) => engines[i % INSTANCES].execute(work(key, claimMode))),
          );
          const kinds = outcomes.map((o) =>
            o.status === 'fulfilled' ? o.value.kind : `${(o.reason as Error).name}: ${(o.reason as Error).message}`,
          );
          expect(kinds.filter((kind) => kind === 'executed')).toHaveLength(1);
          expect(kinds.filter((kind) => kind !== 'executed' && kind !== 'replayed')).toEqual([]);
          expect(started.get(key)).toBe(1);
          expect(await effects(key)).toBe(1);
          // The work ran at the isolation level the app chose: the module changes only its own statements'.
          const executed = outcomes.find((o) => o.status === 'fulfilled' && o.value.kind === 'executed');
          const level = (
            executed as PromiseFulfilledResult<{ response: { body: Buffer | null } }>
          ).value.response.body?.toString();
          expect(level).toBe(
            'workLevel' in setting ? setting.workLevel : 'database' in setting ? setting.database : 'repeatable read',
          );
        }
      },
    );
    if (table === 'partitioned' && !('workLevel' in setting)) {
      it('claim mode request-transaction is refused with the reason, before anything is claimed or run', async () => {
        const key = `refused-${++n}`;
        const refused = engines[0].execute(work(key, 'request-transaction'));
        await expect(refused).rejects.toMatchObject({ name: 'IdempotencyConfigurationError' });
        await expect(refused).rejects.toThrow(/needs the handler's transaction at READ COMMITTED/);
        expect(started.get(key)).toBeUndefined();
        expect(await effects(key)).toBe(0);
      });
    }
  });
});
