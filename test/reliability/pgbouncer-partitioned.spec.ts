import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { PostgresIdempotencyStore } from '../../src/index.js';
import { claimRequest } from '../support/key-table.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
} from '../../src/store/partitioned/partitioned-key-table.sql.js';
import { dataSourceOptions, openDataSource } from '../support/database.js';
import { sleep } from '../support/http.js';
import { PgBouncer } from './support/pgbouncer.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/**
 * The partitioned key table's claim serialises on a transaction-level
 * advisory lock: through PgBouncer in transaction pooling, where many clients
 * share few server connections, the lock must go with each claim's
 * transaction and never stay on a server connection for the next client.
 */
describe('the partitioned key table through PgBouncer in transaction pooling', () => {
  let db: ScenarioDatabase;
  let bouncer: PgBouncer;
  let sources: DataSource[];
  let stores: PostgresIdempotencyStore[];

  beforeAll(async () => {
    db = await ScenarioDatabase.create('pgbouncer_partitioned');
    for (const statement of createPartitionedTableStatements('idempotency_keys', {
      ...DEFAULT_PARTITION_LAYOUT,
      partman: false,
    })) {
      await db.client.query(statement);
    }
    // Four server connections for forty clients.
    bouncer = await PgBouncer.start(db.url, { poolSize: 4 });
    sources = await Promise.all(
      [0, 1].map(() => openDataSource(dataSourceOptions('public', { url: bouncer.url, poolSize: 20 }))),
    );
    stores = sources.map((s) => new PostgresIdempotencyStore(s, 'idempotency_keys', { partitioned: true }));
  });
  afterAll(async () => {
    await Promise.all((sources ?? []).map((s) => s.destroy()));
    await bouncer?.stop();
    await db?.client.end();
  });

  it('40 concurrent claims of each of 10 new keys: one claim per key, and no key lock left on a server connection', async () => {
    for (let k = 0; k < 10; k++) {
      const key = `bounced-${k}-${randomUUID()}`;
      const results = await Promise.all(Array.from({ length: 40 }, (_, i) => stores[i % 2].claim(claimRequest(key))));
      expect(results.filter((r) => r.state === 'claimed')).toHaveLength(1);
    }
    const { rows } = await db.client.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'`);
    expect(rows).toEqual([{ n: 0 }]);
    expect(Number((await db.client.query('SELECT count(*) FROM idempotency_keys')).rows[0].count)).toBe(10);
  });

  it('a request-transaction claim holds the key on its server connection until it commits; a duplicate waits, then replays', async () => {
    const key = `held-${randomUUID()}`;
    const begun = await stores[0].begin(claimRequest(key), 'request-transaction', 5_000);
    expect(begun.claim.state).toBe('claimed');
    try {
      // A separate claim finds the key's lock taken: in flight, at once.
      expect(await stores[1].claim(claimRequest(key))).toMatchObject({ state: 'in-flight' });
      let settled = false;
      const duplicate = stores[1].begin(claimRequest(key), 'request-transaction', 5_000).finally(() => (settled = true));
      await sleep(300);
      expect(settled).toBe(false);
      expect(await begun.attempt!.commit({ status: 201, headers: [], body: Buffer.from('once') }, 3_600_000)).toBe(true);
      const answer = (await duplicate).claim;
      expect(answer.state === 'completed' && answer.response.body?.toString()).toBe('once');
    } finally {
      // A failed expectation must not leave the transaction (and its server connection and lock) open for the next test.
      await begun.attempt?.rollback(false).catch(() => undefined);
    }
  });

  it('retires a partition through it: the sweep lock and the drop each on a pooled connection', async () => {
    await db.client.query(`DO $$ DECLARE today timestamptz := date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00');
      BEGIN EXECUTE format('CREATE TABLE idempotency_keys_earlier PARTITION OF idempotency_keys FOR VALUES FROM (%L) TO (%L)',
                           today - interval '1 day', today); END $$`);
    await db.client
      .query(`INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor, created_at)
      SELECT 'tenant-a', 'old-' || g, 'fp', 'completed', gen_random_uuid(), now() - interval '2 hours', now() - interval '1 second',
             now() - interval '1 second', now() - interval '1 day' FROM generate_series(1, 1000) g`);
    const [a, b] = await Promise.all(stores.map((s) => s.sweep({ batchSize: 250, maxDurationMs: 10_000 })));
    expect([a.ran, b.ran].sort()).toEqual([false, true]);
    expect((a.ran ? a : b).partitions).toMatchObject({ retired: 1 });
    expect((await db.client.query(`SELECT to_regclass('idempotency_keys_earlier') AS found`)).rows).toEqual([{ found: null }]);
  });
});
