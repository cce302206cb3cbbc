import { quoteTableName } from './identifiers.js';
import { keyStoreFunctions } from './key-store.sql.js';

const literal = (value: string) => `'${value.replace(/'/g, "''")}'`;

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
  'expiry_floor',
];

/** The columns of KEY_TABLE_COLUMNS that a key table made by an earlier version lacks (its migration adds them). */
export const KEY_TABLE_COLUMNS_ADDED_BY_UPGRADE: readonly string[] = ['expiry_floor'];

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
      phase_results text,
      expiry_floor timestamptz NOT NULL,`;

/**
 * The key table's fillfactor (per cent of each page that inserts fill): the
 * rest is kept for the completion's new version of the row, so the
 * completion is a HOT update (no new index entries, nothing for the next
 * vacuum to clean in the indexes). Measured with 300 B to 6 KB bodies at 16
 * and 32 concurrent keys: 92-100% of the completions HOT at 90, 77-94% at
 * PostgreSQL's default of 100; docs/design.md has the figures.
 */
export const KEY_TABLE_FILLFACTOR = 90;

/**
 * Drops the index of the key table named `indexName` (as created, unquoted),
 * if it has one: looked up by its table, so an index of that name elsewhere
 * on the search_path is never touched. On a partitioned table it goes from
 * every partition.
 */
export function dropKeyTableIndex(table: string, indexName: string): string {
  return `DO $drop_index$
    DECLARE
      v_index regclass;
    BEGIN
      SELECT i.indexrelid::regclass INTO v_index FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
       WHERE i.indrelid = ${literal(table)}::regclass AND c.relname = ${literal(indexName)};
      IF v_index IS NOT NULL THEN
        EXECUTE format('DROP INDEX %s', v_index);
      END IF;
    END
  $drop_index$`;
}

/**
 * The DDL of the key table, shared by the migration and the documentation so
 * they cannot drift: the table, the sweeper's index on `expiry_floor`, and the
 * claim and completion functions (see `keyStoreFunctions`). Every statement is
 * idempotent, and run on a table an earlier version made they upgrade it
 * (`upgradeToExpiryFloor`, the fillfactor).
 */
export function createTableStatements(tableName: string): string[] {
  const table = quoteTableName(tableName);
  const indexes = plainRetentionIndexes(tableName);
  return [
    `CREATE TABLE IF NOT EXISTS ${table} (
      ${KEY_TABLE_COLUMN_DEFINITIONS}
      PRIMARY KEY (tenant_id, key)
    ) WITH (fillfactor = ${KEY_TABLE_FILLFACTOR})`,
    upgradeToExpiryFloor(table),
    // The sweeper's: the completion never changes expiry_floor, so this index does not stop it being a HOT update.
    `CREATE INDEX IF NOT EXISTS ${quoteTableName(indexes.current)} ON ${table} (expiry_floor)`,
    // The earlier versions' sweeper index: the completion changes expires_at, so with it no completion is HOT.
    dropKeyTableIndex(table, indexes.earlier),
    keyTableFillfactor(table),
    responseBodyStorage(table),
    ...keyStoreFunctions(tableName),
  ];
}

/**
 * The names (unquoted, never schema-qualified: an index lives in its table's
 * schema) of the plain key table's retention index and of the one earlier
 * versions had in its place.
 */
export function plainRetentionIndexes(tableName: string): { current: string; earlier: string } {
  const base = tableName.split('.').pop()!;
  return { current: `${base}_expiry_floor_idx`, earlier: `${base}_expires_at_idx` };
}

/**
 * Adds `expiry_floor` to a key table an earlier version made (both layouts),
 * set to each row's `expires_at` (a floor it is: the claim's expiry, or the
 * completion's, which is later). No-op on a table that has the column. On a
 * large table the UPDATE rewrites every row under the migration's lock:
 * docs/schema.md shows the same steps done online beforehand.
 */
export function upgradeToExpiryFloor(table: string): string {
  return `DO $upgrade$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_attribute
                      WHERE attrelid = ${literal(table)}::regclass AND attname = 'expiry_floor' AND NOT attisdropped) THEN
        ALTER TABLE ${table} ADD COLUMN expiry_floor timestamptz;
      END IF;
      IF NOT (SELECT attnotnull FROM pg_attribute WHERE attrelid = ${literal(table)}::regclass AND attname = 'expiry_floor') THEN
        UPDATE ${table} SET expiry_floor = expires_at WHERE expiry_floor IS NULL;
        ALTER TABLE ${table} ALTER COLUMN expiry_floor SET NOT NULL;
      END IF;
    END
  $upgrade$`;
}

/**
 * Gives a plain key table made by an earlier version the fillfactor (new
 * tables are created with it), unless someone chose one already. Rows
 * written from then on get the room; ALTER TABLE SET takes a lock that does
 * not block reads or writes.
 */
export function keyTableFillfactor(table: string): string {
  return `DO $fillfactor$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_class c, unnest(coalesce(c.reloptions, '{}')) o
                      WHERE c.oid = ${literal(table)}::regclass AND o LIKE 'fillfactor=%') THEN
        ALTER TABLE ${table} SET (fillfactor = ${KEY_TABLE_FILLFACTOR});
      END IF;
    END
  $fillfactor$`;
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
