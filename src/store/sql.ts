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
    // A stored body is written once and read back whole on every replay: kept out of line without a compression
    // attempt, which costs CPU on each write (a JSON body compresses, but a key lives hours, not years) and a
    // decompression on each replay.
    `ALTER TABLE ${table} ALTER COLUMN response_body SET STORAGE EXTERNAL`,
    ...keyStoreFunctions(tableName),
  ];
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
