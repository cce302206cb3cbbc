import type { MigrationInterface } from 'typeorm';
import { DEFAULT_TABLE_NAME } from '../../idempotency.constants.js';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { messages } from '../../errors/messages.js';
import { quoteTableName } from '../identifiers.js';
import { lockedTableMigration } from '../locked-migration.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
  PARTITION_INTERVAL_PATTERN,
  type PartitionLayout,
} from './partitioned-key-table.sql.js';

/** Options of `createPartitionedIdempotencyKeysMigration`. */
export interface PartitionedKeysMigrationOptions {
  /** The same `tableName` given to the module. Default `'idempotency_keys'`. */
  tableName?: string;
  /**
   * The width of one partition, a PostgreSQL interval of whole minutes,
   * hours, days or weeks (`'1 day'`, `'6 hours'`). A partition is dropped
   * about one TTL after its range ends, so the table holds about TTL +
   * interval of keys: narrower partitions keep less, but every claim of a
   * new key looks into each attached one. Default `'1 day'`.
   */
  interval?: string;
  /** Partitions kept ready ahead of now, so claims never wait for upkeep. Default 4. */
  premake?: number;
  /**
   * `'auto'` (default): pg_partman makes the partitions when the extension is
   * installed in this database (`CREATE EXTENSION pg_partman SCHEMA partman`),
   * the module's own function otherwise; `true`: require pg_partman; `false`:
   * never use it.
   */
  partman?: 'auto' | boolean;
}

/**
 * A migration class for the partitioned key table (module option
 * `partitioned: true`), to add to your own `migrations` list in place of
 * `CreateIdempotencyKeys1764460800000`. Safe when several app instances run
 * it at once, like the plain table's: a transaction-level advisory lock
 * serialises them and every statement is idempotent. Needs PostgreSQL 14 or
 * later.
 */
export function createPartitionedIdempotencyKeysMigration(
  options: PartitionedKeysMigrationOptions = {},
): new () => MigrationInterface {
  const tableName = options.tableName ?? DEFAULT_TABLE_NAME;
  const layout = partitionLayout(options);
  return lockedTableMigration({
    baseName: 'CreatePartitionedIdempotencyKeys',
    timestamp: 1765152000000,
    tableName,
    defaultTableName: DEFAULT_TABLE_NAME,
    statements: (name) => createPartitionedTableStatements(name, layout),
    downStatements: (name) => [
      // pg_partman's record of the table, if it has one, goes with it.
      `DO $do$
       DECLARE v_partman text; v_parent text;
       BEGIN
         SELECT e.extnamespace::regnamespace::text INTO v_partman FROM pg_extension e WHERE e.extname = 'pg_partman';
         SELECT n.nspname || '.' || c.relname INTO v_parent
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('${quoteTableName(name).replace(/'/g, "''")}');
         IF v_partman IS NOT NULL AND v_parent IS NOT NULL THEN
           EXECUTE format('DELETE FROM %s.part_config WHERE parent_table = $1', v_partman) USING v_parent;
         END IF;
       END
       $do$`,
      `DROP TABLE IF EXISTS ${quoteTableName(name)}`,
    ],
  });
}

/** The migration of the partitioned table under the default name `idempotency_keys`, daily partitions. */
export const CreatePartitionedIdempotencyKeys1765152000000 = createPartitionedIdempotencyKeysMigration();

function partitionLayout(options: PartitionedKeysMigrationOptions): PartitionLayout {
  const interval = options.interval ?? DEFAULT_PARTITION_LAYOUT.interval;
  if (typeof interval !== 'string' || !PARTITION_INTERVAL_PATTERN.test(interval)) {
    throw new IdempotencyConfigurationError(
      messages.config.partitionLayout('interval', "whole minutes, hours, days or weeks such as '1 day' or '6 hours'", interval),
    );
  }
  const premake = options.premake ?? DEFAULT_PARTITION_LAYOUT.premake;
  if (!Number.isInteger(premake) || premake < 1 || premake > 100) {
    throw new IdempotencyConfigurationError(messages.config.partitionLayout('premake', 'an integer from 1 to 100', premake));
  }
  const partman = options.partman ?? DEFAULT_PARTITION_LAYOUT.partman;
  if (partman !== 'auto' && typeof partman !== 'boolean') {
    throw new IdempotencyConfigurationError(messages.config.partitionLayout('partman', "'auto', true or false", partman));
  }
  return { interval, premake, partman };
}
