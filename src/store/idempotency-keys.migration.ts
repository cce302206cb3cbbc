import type { MigrationInterface } from 'typeorm';
import { DEFAULT_TABLE_NAME } from '../idempotency.constants.js';
import { lockedTableMigration } from './locked-migration.js';
import { createTableStatements } from './sql.js';
import { citusCreateTableStatements } from './citus/citus.sql.js';

/**
 * A migration class for the key table, to add to your own `migrations` list.
 * Safe when several app instances run it at once: a transaction-level
 * advisory lock serialises them and every statement is `IF NOT EXISTS`.
 *
 * @param tableName the same `tableName` given to the module (default `idempotency_keys`).
 * @param options `citus: true` for an app on a Citus cluster (the module option `citus`): the same migration (same
 *   name), whose functions are the Citus texts and which leaves a distributed table's layout as it is when it runs
 *   again. Run `distributeIdempotencyTables` after it the first time.
 */
export function createIdempotencyKeysMigration(
  tableName: string = DEFAULT_TABLE_NAME,
  options: { citus?: boolean } = {},
): new () => MigrationInterface {
  return lockedTableMigration({
    baseName: 'CreateIdempotencyKeys',
    timestamp: 1764460800000,
    tableName,
    defaultTableName: DEFAULT_TABLE_NAME,
    statements: options.citus ? citusCreateTableStatements : createTableStatements,
  });
}

/** The migration for the default table name `idempotency_keys`. */
export const CreateIdempotencyKeys1764460800000 = createIdempotencyKeysMigration();
