import { quoteTableName } from './identifiers.js';
import { keyStoreFunctions } from './key-store.sql.js';

/**
 * Every column of the key table the module reads or writes, as `createTableStatements`
 * creates them; the start-up schema check requires each one. A column added to the
 * DDL is added here too (one line): a test compares this list with the table the DDL
 * creates.
 */
export const KEY_TABLE_COLUMNS: readonly string[] = [
  'tenant_id',
  'key',
  'fingerprint',
  'status',
  'owner_token',
  'generation',
  'attempt',
  'lease_expires_at',
  'expires_at',
  'created_at',
  'completed_at',
  'response_status',
  'response_headers',
  'response_body',
  'recovery_point',
  'phase_results',
];

/** Every column of the outbox table, as `createOutboxStatements` creates them (same rule as `KEY_TABLE_COLUMNS`). */
export const OUTBOX_TABLE_COLUMNS: readonly string[] = [
  'id',
  'tenant_id',
  'topic',
  'payload',
  'status',
  'attempts',
  'available_at',
  'locked_until',
  'lock_token',
  'last_error',
  'created_at',
  'delivered_at',
];

/** The key table's columns, as both its layouts (plain and partitioned) create them; each line ends with a comma. */
export const KEY_TABLE_COLUMN_DEFINITIONS = `tenant_id text NOT NULL,
      key text NOT NULL,
      fingerprint text NOT NULL,
      status text NOT NULL CHECK (status IN ('in_flight', 'completed')),
      owner_token uuid NOT NULL,
      generation uuid,
      attempt integer NOT NULL DEFAULT 1,
      lease_expires_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      completed_at timestamptz,
      response_status integer,
      response_headers jsonb,
      response_body bytea,
      recovery_point text,
      phase_results text,`;

/**
 * The DDL of the key table, shared by the migration and the documentation so
 * they cannot drift: the table, the sweeper's index on `expires_at`, and the
 * claim and completion functions (see `keyStoreFunctions`).
 */
export function createTableStatements(tableName: string): string[] {
  const table = quoteTableName(tableName);
  // An index always lives in its table's schema, so its name is never qualified.
  const indexName = quoteTableName(`${tableName.split('.').pop()}_expires_at_idx`);
  return [
    `CREATE TABLE IF NOT EXISTS ${table} (
      ${KEY_TABLE_COLUMN_DEFINITIONS}
      PRIMARY KEY (tenant_id, key)
    )`,
    `CREATE INDEX IF NOT EXISTS ${indexName} ON ${table} (expires_at)`,
    responseBodyStorage(table),
    ...keyStoreFunctions(tableName),
  ];
}

/**
 * How the key table keeps stored bodies (both layouts; on a partitioned table
 * the partitions made later inherit it). lz4 where the server has it: a
 * JSON body of 0.9 MB is written as a few kilobytes (fewer TOAST pages and
 * WAL, which cost PostgreSQL about 25 ms per such body uncompressed), and
 * lz4 compresses and decompresses at memory speed. A server built without
 * lz4 (or before PostgreSQL 14) keeps bodies out of line with no compression
 * attempt instead: pglz would cost more CPU on each write than it saves.
 */
export function responseBodyStorage(table: string): string {
  return `DO $body_storage$
    BEGIN
      ALTER TABLE ${table} ALTER COLUMN response_body SET COMPRESSION lz4, ALTER COLUMN response_body SET STORAGE EXTENDED;
    EXCEPTION WHEN feature_not_supported OR syntax_error THEN
      ALTER TABLE ${table} ALTER COLUMN response_body SET STORAGE EXTERNAL;
    END
  $body_storage$`;
}

/** DDL of the transactional outbox table. The partial index serves the relay's "next due" query. */
export function createOutboxStatements(tableName: string): string[] {
  const table = quoteTableName(tableName);
  const indexName = quoteTableName(`${tableName.split('.').pop()}_due_idx`);
  return [
    `CREATE TABLE IF NOT EXISTS ${table} (
      id bigserial PRIMARY KEY,
      tenant_id text,
      topic text NOT NULL,
      payload text NOT NULL,
      status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
      attempts integer NOT NULL DEFAULT 0,
      available_at timestamptz NOT NULL DEFAULT now(),
      locked_until timestamptz,
      lock_token uuid,
      last_error text,
      created_at timestamptz NOT NULL DEFAULT now(),
      delivered_at timestamptz
    )`,
    `CREATE INDEX IF NOT EXISTS ${indexName} ON ${table} (available_at, id) WHERE status = 'pending'`,
  ];
}
