import type { MigrationInterface } from 'typeorm';
import { DEFAULT_OUTBOX_TABLE_NAME } from '../idempotency.constants.js';
import { lockedTableMigration } from '../store/locked-migration.js';
import { createOutboxStatements } from '../store/sql.js';

/**
 * A migration class for the outbox table, to add to your own `migrations`.
 * Safe when several instances run it at once (advisory lock, `IF NOT EXISTS`).
 */
export function createOutboxMigration(tableName: string = DEFAULT_OUTBOX_TABLE_NAME): new () => MigrationInterface {
  return lockedTableMigration({
    baseName: 'CreateOutboxMessages',
    timestamp: 1764547200000,
    tableName,
    defaultTableName: DEFAULT_OUTBOX_TABLE_NAME,
    statements: createOutboxStatements,
  });
}

/** The outbox migration for the default table name `outbox_messages`. */
export const CreateOutboxMessages1764547200000 = createOutboxMigration();
