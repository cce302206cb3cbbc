import type { MigrationInterface, QueryRunner } from 'typeorm';
import { DEFAULT_TABLE_NAME } from '../idempotency.constants.js';
import { createEffectLedgerMigration } from '../ledger/effect-ledger.migration.js';
import { createOutboxMigration } from '../outbox/outbox.migration.js';
import type { SourceDataSource } from './connection.js';
import { createIdempotencyKeysMigration } from './idempotency-keys.migration.js';
import { createPartitionedIdempotencyKeysMigration } from './partitioned/partitioned-keys.migration.js';
import { PoolDataSource } from './pool-data-source.js';
import type { PgPool } from './pool-data-source.js';

/** The table where the module's own runner records the migrations it applied (in the first schema of `search_path`). */
export const MODULE_MIGRATIONS_TABLE = 'nest_idempotency_migrations';

/** Which of the module's tables to create: the same values as the module's options of those names. */
export interface IdempotencyTablesOptions {
  /** The key table. Default `idempotency_keys`. */
  tableName?: string;
  /** The partitioned key table (`createPartitionedIdempotencyKeysMigration`, daily partitions). Default false. */
  partitioned?: boolean;
  /** The key table's Citus texts (see the module option `citus`). Default false. */
  citus?: boolean;
  /** Also the outbox table, under this name. Default: none. */
  outboxTableName?: string;
  /** Also the effect ledger's table, under this name. Default: none. */
  ledgerTableName?: string;
}

/** The module's migrations for `options`, in the order they run. */
export function moduleMigrations(options: IdempotencyTablesOptions = {}): Array<new () => MigrationInterface> {
  const tableName = options.tableName ?? DEFAULT_TABLE_NAME;
  const migrations = [
    options.partitioned
      ? createPartitionedIdempotencyKeysMigration({ tableName })
      : createIdempotencyKeysMigration(tableName, { citus: options.citus }),
  ];
  if (options.outboxTableName !== undefined) migrations.push(createOutboxMigration(options.outboxTableName));
  if (options.ledgerTableName !== undefined) migrations.push(createEffectLedgerMigration(options.ledgerTableName));
  return migrations;
}

/** One lock for every instance's runner: the bookkeeping table is created and read only while it is held. */
const LOCK_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('nest-idempotency:module-migrations', 0))`;

/**
 * Applies those of `migrations` not yet recorded in `nest_idempotency_migrations`,
 * all in one transaction that first takes a transaction-level advisory lock:
 * instances starting together run each migration once (a later one waits,
 * then finds nothing pending), and nothing is applied unless everything is.
 * Transaction-level, so it holds behind PgBouncer in transaction pooling and
 * ends with a process that dies.
 *
 * @returns the names of the migrations this call applied (empty when another instance did)
 */
export async function runModuleMigrations(
  source: SourceDataSource,
  migrations: ReadonlyArray<new () => MigrationInterface>,
): Promise<string[]> {
  return source.transaction(async (manager) => {
    await manager.query(LOCK_SQL);
    await manager.query(
      `CREATE TABLE IF NOT EXISTS ${MODULE_MIGRATIONS_TABLE} (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const rows = (await manager.query(`SELECT name FROM ${MODULE_MIGRATIONS_TABLE}`)) as Array<{ name: string }>;
    const done = new Set(rows.map((row) => row.name));
    const applied: string[] = [];
    for (const Migration of migrations) {
      const migration = new Migration();
      const name = migration.name ?? Migration.name;
      if (done.has(name)) continue;
      // The module's migrations send plain statements through `query`, which every query runner of the seam has.
      await migration.up(manager.queryRunner as unknown as QueryRunner);
      await manager.query(`INSERT INTO ${MODULE_MIGRATIONS_TABLE} (name) VALUES ($1)`, [name]);
      done.add(name);
      applied.push(name);
    }
    return applied;
  });
}

/**
 * Creates the module's tables on `pool` with the module's own locked runner
 * (see `runModuleMigrations`): for an app without TypeORM, from a script or
 * at start-up (`migrate: true` does this before the module's start-up check).
 *
 * ```ts
 * await migrateIdempotencyTables(pool, { tableName: 'idempotency_keys' });
 * ```
 *
 * @returns the names of the migrations this call applied
 */
export function migrateIdempotencyTables(pool: PgPool, options: IdempotencyTablesOptions = {}): Promise<string[]> {
  return runModuleMigrations(new PoolDataSource(pool), moduleMigrations(options));
}
