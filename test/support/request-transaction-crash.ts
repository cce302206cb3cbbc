/**
 * A request-transaction attempt in an OS process of its own, for the test that kills the process mid-handler
 * (started through run-typescript.mjs; env DATABASE_URL, APP_SCHEMA, CRASH_KEY). It claims CRASH_KEY of tenant `t`,
 * writes one effect in the attempt's transaction, prints `running`, and waits until it is killed.
 */
import { DataSource, type EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../../src/core/idempotency-engine.js';
import { PostgresIdempotencyStore } from '../../src/store/postgres/postgres-idempotency.store.js';

const schema = process.env.APP_SCHEMA!;
const key = process.env.CRASH_KEY!;

const dataSource = new DataSource({
  type: 'postgres',
  url: process.env.DATABASE_URL,
  schema,
  extra: { options: `-c search_path=${schema}`, max: 4 },
});
await dataSource.initialize();
const engine = new IdempotencyEngine<EntityManager>(new PostgresIdempotencyStore(dataSource, 'idempotency_keys'));
await engine.execute({
  tenant: 't',
  key,
  fingerprint: 'same',
  leaseMs: 30_000,
  ttlMs: 60_000,
  claimMode: 'request-transaction',
  waitMs: 0,
  heartbeat: false,
  onFailure: () => ({ action: 'keep' as const }),
  run: async (tx: EntityManager) => {
    await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key]);
    process.stdout.write('running\n');
    // Killed here, its transaction open.
    await new Promise(() => undefined);
    return { response: { status: 201, headers: [], body: Buffer.from('never') }, result: 'never' };
  },
});
