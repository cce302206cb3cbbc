import { quoteTableName } from '../store/identifiers.js';

/**
 * Every column of the ledger table, as `createEffectLedgerStatements` creates them;
 * the start-up schema check requires each one (a test compares the two).
 */
export const LEDGER_TABLE_COLUMNS: readonly string[] = ['tenant_id', 'scope', 'key', 'generation', 'recorded_at'];

/**
 * DDL of the effect ledger. The primary key is the whole point: one row per
 * (tenant, scope, business key), for ever. No TTL, no sweeper, no index on
 * time: a row is the proof that an effect committed, and it must outlive
 * every idempotency key, retry horizon and dead-letter queue.
 */
export function createEffectLedgerStatements(tableName: string): string[] {
  return [
    `CREATE TABLE IF NOT EXISTS ${quoteTableName(tableName)} (
      tenant_id text NOT NULL,
      scope text NOT NULL,
      key text NOT NULL,
      generation uuid,
      recorded_at timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (tenant_id, scope, key)
    )`,
  ];
}

/**
 * Records one effect. `ON CONFLICT DO NOTHING` waits on a concurrent
 * transaction that inserted the same key: a row is returned only when this
 * transaction is the one that records it (the other rolled back, or never
 * was), nothing when a committed transaction recorded it first.
 */
export function recordEffectSql(tableName: string): string {
  return `/* nest-idempotency:ledger */ INSERT INTO ${quoteTableName(tableName)} (tenant_id, scope, key, generation)
    VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, scope, key) DO NOTHING RETURNING recorded_at`;
}

export function findEffectSql(tableName: string): string {
  return `/* nest-idempotency:ledger */ SELECT recorded_at FROM ${quoteTableName(tableName)}
    WHERE tenant_id = $1 AND scope = $2 AND key = $3`;
}
