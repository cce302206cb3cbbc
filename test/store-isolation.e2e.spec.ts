import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource } from './support/database.js';

/**
 * The store sends the claim and the transaction's start as one message; a
 * data source's `isolationLevel` must still apply to the work, and come
 * before any statement of the transaction (PostgreSQL refuses a SET
 * TRANSACTION ISOLATION LEVEL after the claim).
 */
describe.each(['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const)('a data source with isolationLevel %s', (level) => {
  let dataSource: DataSource;
  let engine: IdempotencyEngine<EntityManager>;
  let n = 0;

  beforeAll(async () => {
    const schema = await freshSchema(`isolation_${level.replace(' ', '_').toLowerCase()}`);
    await createTables(schema);
    dataSource = await openDataSource({ ...dataSourceOptions(schema), isolationLevel: level } as never);
    engine = new IdempotencyEngine(new PostgresIdempotencyStore(dataSource, 'idempotency_keys'));
  });
  afterAll(async () => {
    await dataSource?.destroy();
  });

  it.each(['separate', 'request-transaction'] as const)(
    'runs the work at that level in claim mode %s, and replays it',
    async (claimMode) => {
      const key = `iso-${claimMode}-${++n}`;
      const work = {
        tenant: 't',
        key,
        fingerprint: 'f',
        leaseMs: 30_000,
        ttlMs: 60_000,
        claimMode,
        onFailure: () => ({ action: 'keep' as const }),
        run: async (tx: EntityManager) => {
          const [{ level: seen }] = (await tx.query("SELECT upper(current_setting('transaction_isolation')) AS level")) as Array<{
            level: string;
          }>;
          await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key]);
          return { response: { status: 201, headers: [], body: Buffer.from(seen) }, result: seen };
        },
      };
      const first = await engine.execute(work);
      expect(first).toMatchObject({ kind: 'executed', result: level });
      const again = await engine.execute(work);
      expect(again.kind).toBe('replayed');
      expect(again.response.body?.toString()).toBe(level);
      const [{ count }] = (await dataSource.query('SELECT count(*)::int AS count FROM effects WHERE label = $1', [
        key,
      ])) as Array<{
        count: number;
      }>;
      expect(count).toBe(1);
    },
  );
});
