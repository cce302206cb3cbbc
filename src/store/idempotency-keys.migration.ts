import type { MigrationInterface } from 'typeorm';
import { DEFAULT_TABLE_NAME } from '../idempotency.constants.js';
import { lockedTableMigration } from './locked-migration.js';
import { createTableStatements } from './sql.js';

/**
 * A migration class for the key table, to add to your own `migrations` list.
 * Safe when several app instances run it at once: a transaction-level
 * advisory lock serialises them and every statement is `IF NOT EXISTS`.
 *
 * @param tableName the same `tableName` given to the module (default `idempotency_keys`).
 */
export function createIdempotencyKeysMigration(tableName: string = DEFAULT_TABLE_NAME): new () => MigrationInterface {
  return lockedTableMigration({
    baseName: 'CreateIdempotencyKeys',
    timestamp: 1764460800000,
    tableName,
    defaultTableName: DEFAULT_TABLE_NAME,
    statements: createTableStatements,
  });
}

/** The migration for the default table name `idempotency_keys`. */
export const CreateIdempotencyKeys1764460800000 = createIdempotencyKeysMigration();
