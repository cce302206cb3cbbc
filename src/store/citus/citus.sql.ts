import { quoteTableName } from '../identifiers.js';
import { delegatedGuard } from '../function-dialect.js';
import { keyLock, keyStoreFunction } from '../key-function-parts.sql.js';
import { keyStoreFunctions } from '../key-store.sql.js';
import { createTableStatements, responseBodyStorage } from '../sql.js';

export { delegatedGuard, NOT_DELEGATED_SQLSTATE } from '../function-dialect.js';
import { sqlMarker } from '../sql-marker.js';

/**
 * What running the module on a Citus cluster, sharded by tenant, needs in SQL (issue 31). See
 * docs/citus-findings.md for what was tried and what each statement answered.
 *
 * On Citus the key table, the outbox and the ledger are distributed by `tenant_id` and co-located with the
 * app's business tables, so a tenant's key row, its outbox messages, its ledger rows and its business rows
 * live in shards on one worker, and a request's transaction touches one worker (no two-phase commit). Every
 * statement of the request path that writes the key table goes through a function delegated to that worker
 * (`create_distributed_function(..., 'p_tenant', force_delegation => true)`):
 *
 * - Citus refuses, from the coordinator and even inside a delegated function, `now()` in `ON CONFLICT DO
 *   UPDATE` and `clock_timestamp()` / `gen_random_uuid()` in an `UPDATE`: the function texts of the Citus
 *   dialect read them into variables first (`keyStoreFunctions(name, 'citus')`).
 * - An advisory lock is local to the node that takes it. The key's lock is taken inside the delegated
 *   functions, so on the worker holding the tenant's shard, by every claim whichever coordinator (or worker,
 *   with query-from-any-node) received it. The store's own `pg_try_advisory_xact_lock` statement
 *   (`holdKeyLock`) would run on the coordinator, so it becomes a delegated function too.
 * - Each delegated function checks that it runs on the node holding the tenant's shard, and raises
 *   otherwise: Citus falls back to running a distributed function on the coordinator, silently, whenever
 *   it cannot delegate the call, and the key's lock would then be taken on the wrong node.
 */

/** The functions the Citus layout adds, named after the key table (`"idempotency_keys_renew_lease"`). */
export type CitusKeyFunction = 'renew_lease' | 'record_phase' | 'release' | 'end_lease' | 'hold_key_lock';

export function citusKeyFunction(quotedTable: string, name: CitusKeyFunction): string {
  return `${quotedTable.slice(0, -1)}_${name}"`;
}

/**
 * The statements the store sends one by one (renewal, phase, release, the board's release, the key lock of a
 * REPEATABLE READ attempt), as functions of the key table delegated with it. Same fences and answers as the
 * statements in key-store.sql.ts; each returns what the store reads (rows affected, the key).
 */
export function citusExtraFunctions(tableName: string): string[] {
  const t = quoteTableName(tableName);
  const f = (name: CitusKeyFunction) => citusKeyFunction(t, name);
  const guard = delegatedGuard(tableName);
  return [
    `CREATE OR REPLACE FUNCTION ${f('renew_lease')}(p_tenant text, p_key text, p_owner uuid, p_lease_ms float8)
     RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
     DECLARE
       v_clock timestamptz := clock_timestamp();
       n integer;
     BEGIN
       ${guard}
       UPDATE ${t} SET lease_expires_at = v_clock + interval '1 millisecond' * p_lease_ms
        WHERE tenant_id = p_tenant AND key = p_key AND owner_token = p_owner AND status = 'in_flight';
       GET DIAGNOSTICS n = ROW_COUNT;
       RETURN n;
     END
     $fn$`,
    `CREATE OR REPLACE FUNCTION ${f('record_phase')}(
       p_tenant text, p_key text, p_owner uuid, p_recovery_point text, p_results text, p_lease_ms float8)
     RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
     DECLARE
       v_clock timestamptz := clock_timestamp();
       n integer;
     BEGIN
       ${guard}
       UPDATE ${t}
          SET recovery_point = p_recovery_point, phase_results = p_results,
              lease_expires_at = v_clock + interval '1 millisecond' * p_lease_ms
        WHERE tenant_id = p_tenant AND key = p_key AND owner_token = p_owner AND status = 'in_flight';
       GET DIAGNOSTICS n = ROW_COUNT;
       RETURN n;
     END
     $fn$`,
    // The store's release statement (a CTE of a DELETE and an UPDATE with disjoint conditions), as two statements.
    `CREATE OR REPLACE FUNCTION ${f('release')}(p_tenant text, p_key text, p_owner uuid)
     RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
     DECLARE
       v_now timestamptz := now();
       v_token uuid := gen_random_uuid();
       gone integer;
       ended integer;
     BEGIN
       ${guard}
       DELETE FROM ${t}
        WHERE tenant_id = p_tenant AND key = p_key AND owner_token = p_owner AND status = 'in_flight'
          AND attempt = 1 AND recovery_point IS NULL;
       GET DIAGNOSTICS gone = ROW_COUNT;
       UPDATE ${t} SET lease_expires_at = v_now, owner_token = v_token
        WHERE tenant_id = p_tenant AND key = p_key AND owner_token = p_owner AND status = 'in_flight'
          AND NOT (attempt = 1 AND recovery_point IS NULL);
       GET DIAGNOSTICS ended = ROW_COUNT;
       RETURN gone + ended;
     END
     $fn$`,
    `CREATE OR REPLACE FUNCTION ${f('end_lease')}(p_tenant text, p_owner uuid)
     RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
     DECLARE
       v_now timestamptz := now();
       v_token uuid := gen_random_uuid();
       v_key text;
     BEGIN
       ${guard}
       UPDATE ${t} SET lease_expires_at = v_now, owner_token = v_token
        WHERE tenant_id = p_tenant AND owner_token = p_owner AND status = 'in_flight'
        RETURNING key INTO v_key;
       RETURN v_key;
     END
     $fn$`,
    `CREATE OR REPLACE FUNCTION ${f('hold_key_lock')}(p_tenant text, p_key text)
     RETURNS boolean LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
     BEGIN
       ${guard}
       RETURN pg_try_advisory_xact_lock(${keyLock(tableName)});
     END
     $fn$`,
  ];
}

/** The signatures `create_distributed_function` names (argument types only). */
export function citusFunctionSignatures(tableName: string): string[] {
  const t = quoteTableName(tableName);
  const k = (name: Parameters<typeof keyStoreFunction>[1]) => keyStoreFunction(t, name);
  const c = (name: CitusKeyFunction) => citusKeyFunction(t, name);
  return [
    `${k('claim')}(text, text, text, uuid, float8, float8, float8)`,
    `${k('claim_in_transaction')}(text, text, text, uuid, float8, float8, float8)`,
    `${k('complete')}(text, text, uuid, integer, jsonb, bytea, float8)`,
    `${k('complete_or_raise')}(text, text, uuid, integer, jsonb, bytea, float8)`,
    `${k('complete_in_transaction')}(text, text, text, uuid, integer, jsonb, bytea, float8)`,
    `${c('renew_lease')}(text, text, uuid, float8)`,
    `${c('record_phase')}(text, text, uuid, text, text, float8)`,
    `${c('release')}(text, text, uuid)`,
    `${c('end_lease')}(text, uuid)`,
    `${c('hold_key_lock')}(text, text)`,
  ];
}

/**
 * The key table's migration for a Citus cluster (`createIdempotencyKeysMigration(name, { citus: true })`): the same
 * table and index, with the Citus texts of the functions (and the five it adds), so that running it again, as an
 * upgrade asks, keeps the layout instead of putting back texts the workers refuse. The body-storage step is
 * skipped on a distributed table, where Citus refuses `ALTER COLUMN ... SET COMPRESSION / SET STORAGE` (0A000)
 * and the shards already kept what the table had when it was distributed.
 */
export function citusCreateTableStatements(tableName: string): string[] {
  const table = quoteTableName(tableName);
  const singleServer = new Set([responseBodyStorage(table), ...keyStoreFunctions(tableName)]);
  const literal = `'${table.replace(/'/g, "''")}'`;
  const bodyStorage = responseBodyStorage(table)
    .replace(
      /^DO \$body_storage\$\s*BEGIN/,
      () => `DO $body_storage$
    DECLARE
      v_distributed boolean := false;
    BEGIN
      -- Dynamic: pg_dist_partition exists only where Citus is installed.
      IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))'
          INTO v_distributed USING ${literal};
      END IF;
      IF v_distributed THEN
        RETURN;
      END IF;
      BEGIN`,
    )
    .replace(/END\s*\$body_storage\$$/, () => 'END;\n    END\n  $body_storage$');
  return [
    ...createTableStatements(tableName).filter((statement) => !singleServer.has(statement)),
    bodyStorage,
    ...keyStoreFunctions(tableName, 'citus'),
    ...citusExtraFunctions(tableName),
  ];
}

/** What `distributeIdempotencyTables` is given. */
export interface CitusLayout {
  /** The key table (default `idempotency_keys`). */
  tableName?: string;
  /** A business table distributed by tenant that the module's tables are co-located with (`'charges'`). */
  colocateWith: string;
  /** The outbox table, when the `outbox` option is used. */
  outboxTableName?: string;
  /** The ledger table, when the `ledger` option is used. */
  ledgerTableName?: string;
}

/**
 * What a user runs once on the coordinator, after the module's migrations and after distributing the business
 * table named in `colocateWith`: the Citus texts of the key functions, the extra functions, the tables
 * distributed by `tenant_id` and co-located, the functions delegated by their tenant argument. Each statement
 * is idempotent (a table already distributed, a function already delegated, are left as they are), and
 * `create_distributed_table` cannot run in a transaction block that wrote before it: run them one by one.
 */
export function distributeIdempotencyTablesStatements(layout: CitusLayout): string[] {
  const keys = layout.tableName ?? 'idempotency_keys';
  const lit = (value: string) => `'${value.replace(/'/g, "''")}'`;
  const distribute = (table: string) =>
    `DO $dist$ BEGIN
       IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = ${lit(quoteTableName(table))}::regclass) THEN
         PERFORM create_distributed_table(${lit(quoteTableName(table))}, 'tenant_id', colocate_with => ${lit(quoteTableName(layout.colocateWith))});
       END IF;
     END $dist$`;
  const statements = [...keyStoreFunctions(keys, 'citus'), ...citusExtraFunctions(keys), distribute(keys)];
  if (layout.outboxTableName) {
    // Citus enforces only unique constraints that contain the distribution column, and a NULL tenant cannot
    // be routed: the outbox's key becomes (tenant_id, id), so every message needs a tenant.
    statements.push(
      `DO $pk$
       DECLARE v_pk text;
       BEGIN
         SELECT c.conname INTO v_pk FROM pg_constraint c
          WHERE c.conrelid = ${lit(quoteTableName(layout.outboxTableName))}::regclass AND c.contype = 'p'
            AND NOT (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attname = 'tenant_id') = ANY (c.conkey);
         IF v_pk IS NOT NULL THEN
           EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I, ADD PRIMARY KEY (tenant_id, id)', ${lit(quoteTableName(layout.outboxTableName))}, v_pk);
         END IF;
       END $pk$`,
      distribute(layout.outboxTableName),
    );
  }
  if (layout.ledgerTableName) statements.push(distribute(layout.ledgerTableName));
  for (const signature of citusFunctionSignatures(keys)) {
    statements.push(
      `SELECT create_distributed_function(${lit(signature)}, 'p_tenant', colocate_with => ${lit(quoteTableName(keys))}, force_delegation => true)`,
    );
  }
  return statements;
}

/**
 * The store's statements on the Citus layout that differ from key-store.sql.ts: calls of the delegated
 * functions instead of UPDATEs the coordinator refuses, and of `hold_key_lock` instead of a lock the
 * coordinator would take on itself. `affected` becomes the function's answer (`n`, `released`, `key`).
 */
export function citusKeyStatements(t: string) {
  const c = (name: CitusKeyFunction) => citusKeyFunction(t, name);
  return {
    // The sweep's batch without FOR UPDATE SKIP LOCKED, which Citus runs only in single-shard queries ("could not
    // run distributed query with FOR UPDATE/SHARE commands"). Citus plans the doomed CTE (ORDER BY, LIMIT) on its
    // own first, then deletes against its result on every shard in one distributed transaction (two-phase commit).
    // It walks the expiry_floor index as the single-server batch does (see keyStoreStatements().sweepBatch).
    // A row another transaction holds is waited for instead of skipped, and the DELETE re-checks the row once its
    // lock is granted (READ COMMITTED), so a row a takeover renewed meanwhile is kept. The batch then deletes fewer
    // rows than it found: `candidates` (what it found) tells the sweeper whether more may follow, and `last` comes
    // from the candidates, so the next batch starts past the kept row.
    sweepBatch: `${sqlMarker('sweep-batch')}
      WITH doomed AS (
        SELECT tenant_id, key, expiry_floor FROM ${t}
         WHERE expiry_floor <= now() AND expiry_floor >= $2::timestamptz
           AND expires_at <= now() AND NOT (status = 'in_flight' AND lease_expires_at > now())
         ORDER BY expiry_floor
         LIMIT $1
      ), gone AS (
        DELETE FROM ${t} AS k USING doomed
         WHERE k.tenant_id = doomed.tenant_id AND k.key = doomed.key
           AND k.expires_at <= now() AND NOT (k.status = 'in_flight' AND k.lease_expires_at > now())
        RETURNING k.key
      )
      SELECT (SELECT count(*)::integer FROM gone) AS deleted, count(*)::integer AS candidates,
             to_char(max(expiry_floor) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS last
        FROM doomed`,
    holdKeyLock: `${sqlMarker('hold-key')} SELECT ${c('hold_key_lock')}($1, $2) AS locked`,
    renewLease: `${sqlMarker('renew-lease')} SELECT ${c('renew_lease')}($1, $2, $3::uuid, $4) AS n`,
    recordPhase: `${sqlMarker('record-phase')} SELECT ${c('record_phase')}($1, $2, $3::uuid, $4, $5, $6) AS n`,
    release: `${sqlMarker('release')} SELECT ${c('release')}($1, $2, $3::uuid) AS released`,
    endLease: `${sqlMarker('end-lease')} SELECT ${c('end_lease')}($1, $2::uuid) AS key`,
  } as const;
}
