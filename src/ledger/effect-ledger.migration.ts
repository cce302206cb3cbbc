import type { MigrationInterface } from 'typeorm';
import { DEFAULT_LEDGER_TABLE_NAME } from '../idempotency.constants.js';
import { lockedTableMigration } from '../store/locked-migration.js';
import { createEffectLedgerStatements } from './effect-ledger.sql.js';

/**
 * A migration class for the effect ledger table, to add to your own
 * `migrations`. Safe when several instances run it at once (advisory lock,
 * `IF NOT EXISTS`).
 *
 * @param tableName the same `ledger.tableName` given to the module (default `effect_ledger`).
 */
export function createEffectLedgerMigration(tableName: string = DEFAULT_LEDGER_TABLE_NAME): new () => MigrationInterface {
  return lockedTableMigration({
    baseName: 'CreateEffectLedger',
    timestamp: 1764806400000,
    tableName,
    defaultTableName: DEFAULT_LEDGER_TABLE_NAME,
    statements: createEffectLedgerStatements,
  });
}

/** The ledger migration for the default table name `effect_ledger`. */
export const CreateEffectLedger1764806400000 = createEffectLedgerMigration();
