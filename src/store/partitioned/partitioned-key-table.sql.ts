import { quoteTableName } from '../identifiers.js';
import {
  CLAIM_FUNCTION_SIGNATURE,
  EXPIRY_FLOOR_SLACK,
  HELD_ELSEWHERE,
  KEY_FUNCTIONS_VERSION,
  keyLock,
  keyStoreFunction,
} from '../key-function-parts.sql.js';
import { completionFunctions } from '../key-store.sql.js';
import { WAIT_FOR_KEY_LOCK } from '../request-transaction-key.sql.js';
import {
  dropKeyTableIndex,
  KEY_TABLE_COLUMN_DEFINITIONS,
  KEY_TABLE_FILLFACTOR,
  responseBodyStorage,
  upgradeToExpiryFloor,
} from '../sql.js';
import { sqlMarker } from '../sql-marker.js';

/**
 * The partitioned key table: the plain table's columns and state table, range
 * partitioned by `created_at` (when the current use of the key was first
 * claimed), so that retention drops whole partitions instead of deleting rows.
 *
 * PostgreSQL enforces a unique constraint only within a partition unless it
 * contains the partition key, so the primary key is `(tenant_id, key,
 * created_at)` and nothing in the catalog stops two rows of one key in two
 * partitions. The claim function makes up for it (see `partitionedClaimFunction`):
 *
 * 1. Every claim that may write takes `pg_advisory_xact_lock` on a hash of
 *    (tenant, key) before it looks, held until its transaction ends: its own
 *    transaction in the default claim mode, the request's in
 *    `request-transaction` mode. Two claims of one key serialise, whichever
 *    partition their rows are in; a hash collision only makes two keys wait
 *    for each other.
 * 2. Under the lock it looks for the key in every attached partition (READ
 *    COMMITTED: a statement sees what committed before it started, so
 *    everything the previous holder of the lock wrote).
 * 3. At most one row of a key is not inert (inert: completed and past its TTL,
 *    which nothing ever writes again), and that row decides as the plain
 *    table's row does. A takeover updates it in place; a new row is inserted
 *    only when every row of the key is inert or absent, and an in-flight row
 *    whose lease and TTL both ended is deleted first, so its owner's
 *    completion finds nothing and is fenced as on the plain table.
 *
 * So which partition a row sits in never matters to a claim: the rule holds
 * across partitions, new ones and dropped ones alike. Completions, lease
 * renewals, phases and releases address the row by (tenant, key, owner token)
 * in whichever partition holds it, as on the plain table.
 *
 * Retirement (`retirePartitionFunction`) drops a partition only when it can no
 * longer receive claims and none of its rows is live: past its TTL and with no
 * valid lease (`retainUntil`), checked again under an ACCESS EXCLUSIVE lock
 * on the key table, so no completion or renewal can make a row live between
 * the check and the drop.
 */

/**
 * Until when a row must be kept: its TTL, or its lease when it is in flight
 * and the lease ends later. A row is live (a claim must find it) while this is
 * in the future; it is the plain sweeper's condition as one expression.
 *
 * @param k the row's alias
 */
export function retainUntil(k: string): string {
  return `(CASE WHEN ${k}.status = 'in_flight' THEN greatest(${k}.expires_at, ${k}.lease_expires_at) ELSE ${k}.expires_at END)`;
}

/**
 * What the retention index holds: `retainUntil` of an in-flight row, and for
 * a completed row a bound its expiry passes by at most EXPIRY_FLOOR_SLACK. It
 * reads only columns a completion leaves alone (`retainUntil` reads status and
 * expires_at), so the index does not keep the completion from being a HOT
 * update. Used verbatim in the index and in every query that should use it.
 *
 * @param k the row's alias
 */
export function retentionBound(k: string): string {
  return `greatest(${k}.expiry_floor, ${k}.lease_expires_at)`;
}

/** How the partitions are laid out, as the migration makes them. */
export interface PartitionLayout {
  /** The width of a partition: a PostgreSQL interval such as `'1 day'`, `'6 hours'`. */
  interval: string;
  /** Partitions kept ready ahead of now. */
  premake: number;
  /**
   * `'auto'`: let pg_partman create the partitions when the extension is
   * installed in the database, the module's own function otherwise; `true`:
   * require pg_partman; `false`: never use it.
   */
  partman: 'auto' | boolean;
}

export const DEFAULT_PARTITION_LAYOUT: PartitionLayout = { interval: '1 day', premake: 4, partman: 'auto' };

/** Intervals the layout accepts: whole minutes, hours, days or weeks (what `date_bin` and pg_partman both take). */
export const PARTITION_INTERVAL_PATTERN = /^[1-9][0-9]{0,3} (minute|hour|day|week)s?$/;

const literal = (value: string) => `'${value.replace(/'/g, "''")}'`;

/**
 * Whether `partition` (a partition of the key table, as SQL) holds a live
 * row. One probe of its retention index while any row's bound lies ahead;
 * once none does, the completed rows whose bound passed within the slack are
 * read to see whether one still is (at most a slack's worth of rows, in the
 * minute or so before the partition goes).
 */
export function liveRowQuery(partition: string): string {
  return `SELECT EXISTS (SELECT 1 FROM ONLY ${partition} k WHERE ${retentionBound('k')} > now())
       OR EXISTS (SELECT 1 FROM ONLY ${partition} k
                   WHERE ${retentionBound('k')} > now() - ${EXPIRY_FLOOR_SLACK} AND ${retentionBound('k')} <= now()
                     AND ${retainUntil('k')} > now())`;
}

/** `liveRowQuery` of partition `%1$s`, as a literal for `format()`. */
const LIVE_ROW_CHECK = literal(liveRowQuery('%1$s'));

type PartitionedFunction = 'make_partitions' | 'retire_partition' | 'partition_status';

/** A maintenance function of the partitioned key table, named after it: `"billing"."payment_keys_retire_partition"`. */
export function partitionedFunction(quotedTable: string, name: PartitionedFunction): string {
  return `${quotedTable.slice(0, -1)}_${name}"`;
}

/** SQLSTATE of a partitioned claim that would write outside READ COMMITTED (feature_not_supported). */
export const PARTITIONED_ISOLATION_SQLSTATE = '0A000';

/** Marks the claim function of a partitioned table, so the start-up check can tell it from the plain table's. */
export const PARTITIONED_CLAIM_MARKER = 'nest-idempotency-pg: claim of a partitioned key table';

/**
 * The DDL of the partitioned key table: the parent, the retention index, the
 * functions (claim, completion, partition upkeep and retirement), and the
 * first partitions with a default partition, made by pg_partman or by the
 * module's own function (see `PartitionLayout.partman`). Every statement is
 * idempotent, as the plain table's are, and they upgrade a table an earlier
 * version made in the same way (`upgradeToExpiryFloor`, the retention index,
 * the partitions' fillfactor).
 */
export function createPartitionedTableStatements(tableName: string, layout: PartitionLayout): string[] {
  const t = quoteTableName(tableName);
  const indexes = partitionedRetentionIndexes(tableName);
  return [
    `CREATE TABLE IF NOT EXISTS ${t} (
      ${KEY_TABLE_COLUMN_DEFINITIONS}
      PRIMARY KEY (tenant_id, key, created_at)
    ) PARTITION BY RANGE (created_at)`,
    upgradeToExpiryFloor(t),
    responseBodyStorage(t),
    // Serves the retirement check (is anything in this partition still live?) and the default partition's sweep.
    `CREATE INDEX IF NOT EXISTS ${quoteTableName(indexes.current)} ON ${t} (${retentionBound(t)})`,
    // The earlier versions' retention index, on expires_at and status: with it no completion is HOT.
    dropKeyTableIndex(t, indexes.earlier),
    partitionedClaimFunction(tableName),
    ...completionFunctions(tableName),
    makePartitionsFunction(tableName, layout),
    retirePartitionFunction(tableName),
    partitionStatusFunction(tableName),
    registerPartitions(tableName, layout),
    // Partitions an earlier version made: the fillfactor, from the rows written next on.
    `DO $settings$ DECLARE v_part record; BEGIN ${matchPartitionSettings(t)} END $settings$`,
  ];
}

/**
 * The names (unquoted: an index lives in its table's schema) of the
 * partitioned key table's retention index and of the one earlier versions had
 * in its place.
 */
export function partitionedRetentionIndexes(tableName: string): { current: string; earlier: string } {
  const base = tableName.split('.').pop()!;
  return { current: `${base}_retention_bound_idx`, earlier: `${base}_retain_until_idx` };
}

/**
 * The claim of a partitioned table: the same signature and answers as the
 * plain table's (`keyStoreFunctions`), so the store calls it the same way.
 * See the top of this file for why one execution per key holds across
 * partitions.
 *
 * In claim mode `separate` (`p_lock_timeout_ms` null) the lock is tried
 * without waiting: free (no other claim of the key is running, the common
 * case), the claim reads once under it. Taken, the claim still reads, as the
 * plain table's claim reads before it locks: a live completed row, a valid
 * lease or another fingerprint is an answer no concurrent claim can change (a
 * replay, a 409, a 422 never wait); a claim that would write answers in
 * flight instead, since another attempt of the key (a claim, or a
 * request-transaction attempt that has written nothing yet) holds it. In
 * `request-transaction` mode the lock is waited for (WAIT_FOR_KEY_LOCK); that mode needs READ COMMITTED here.
 */
function partitionedClaimFunction(tableName: string): string {
  const t = quoteTableName(tableName);
  return `CREATE OR REPLACE FUNCTION ${keyStoreFunction(t, 'claim')}${CLAIM_FUNCTION_SIGNATURE}
     LANGUAGE plpgsql AS $fn$
     -- ${PARTITIONED_CLAIM_MARKER}
     -- ${KEY_FUNCTIONS_VERSION}
     DECLARE
       r ${t}%ROWTYPE;
       v_current boolean;
       v_lock bigint := ${keyLock(tableName)};
       v_lock_timeout text := current_setting('lock_timeout');
       locked boolean;
     BEGIN
       -- Uncontended (the common case: a new key, a replay), the lock is free: taken now, the claim reads once.
       locked := pg_try_advisory_xact_lock(v_lock);
       FOR i IN 1..4 LOOP
         -- The key's row that is not inert, in whichever partition: there is at most one (inert rows, of earlier
         -- uses of the key, never decide anything).
         SELECT * INTO r FROM ${t} k WHERE k.tenant_id = p_tenant AND k.key = p_key
            AND (k.status = 'in_flight' OR k.expires_at > now())
          ORDER BY k.created_at DESC
          LIMIT 1;
         v_current := FOUND;
         IF v_current THEN
           IF r.status = 'in_flight' AND r.lease_expires_at > now() THEN
             RETURN QUERY SELECT CASE WHEN r.fingerprint = p_fingerprint THEN 'in_flight' ELSE 'mismatch' END, r.attempt,
               NULL::text, greatest(1, ceil(extract(epoch FROM (r.lease_expires_at - now()))))::integer,
               NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
             RETURN;
           ELSIF r.expires_at > now() AND r.fingerprint <> p_fingerprint THEN
             RETURN QUERY SELECT 'mismatch'::text, r.attempt, NULL::text, NULL::integer,
               NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
             RETURN;
           ELSIF r.expires_at > now() AND r.status = 'completed' THEN
             -- retry_after carries the seconds the record has left, by this clock: how long a replay may be remembered.
             RETURN QUERY SELECT 'completed'::text, r.attempt, NULL::text,
               least(floor(extract(epoch FROM (r.expires_at - now()))), 2147483647)::integer,
               r.response_status, r.response_headers, r.response_body, NULL::text, NULL::text;
             RETURN;
           END IF;
         END IF;
         IF NOT locked THEN
           -- Another attempt of the key holds its lock (a claim, or a request-transaction attempt that has written
           -- nothing yet). A separate claim answers in flight; a request-transaction claim waits for it, then reads
           -- again what it committed.
           IF p_lock_timeout_ms IS NULL THEN
             ${HELD_ELSEWHERE}
             RETURN;
           END IF;
           ${WAIT_FOR_KEY_LOCK}
           locked := true;
           CONTINUE;
         END IF;
         IF current_setting('transaction_isolation') <> 'read committed' THEN
           -- Under REPEATABLE READ or SERIALIZABLE every read sees the snapshot taken when this statement began,
           -- before the lock: it would miss a row of the key that a claim holding the lock committed since, in any
           -- partition (no unique index spans them to catch it). The store claims at READ COMMITTED in claim mode
           -- separate, and refuses request-transaction mode on this table at a stricter level.
           RAISE EXCEPTION 'a claim on the partitioned key table % needs READ COMMITTED, not %', ${literal(tableName)},
             current_setting('transaction_isolation')
             USING ERRCODE = '${PARTITIONED_ISOLATION_SQLSTATE}',
                   HINT = 'Use claimMode ''separate'' with the partitioned table, or run the transaction at READ COMMITTED.';
         END IF;
         IF v_current AND r.status = 'in_flight' AND r.expires_at > now() THEN
           -- Its lease lapsed, same fingerprint: take it over in place (its partition stays; a claim never moves a row).
           RETURN QUERY
             UPDATE ${t} AS k SET
               owner_token = p_owner,
               attempt = k.attempt + 1,
               generation = coalesce(k.generation, p_owner),
               lease_expires_at = now() + interval '1 millisecond' * p_lease_ms,
               expires_at = now() + interval '1 millisecond' * p_ttl_ms,
               expiry_floor = now() + interval '1 millisecond' * p_ttl_ms
             WHERE k.tenant_id = p_tenant AND k.key = p_key AND k.owner_token = r.owner_token
               AND k.status = 'in_flight' AND k.lease_expires_at <= now()
             RETURNING 'claimed'::text, k.attempt, k.generation::text, NULL::integer,
                       NULL::integer, NULL::jsonb, NULL::bytea, k.recovery_point, k.phase_results;
           IF FOUND THEN
             RETURN;
           END IF;
           -- Its owner renewed, completed or released it meanwhile: look again.
           CONTINUE;
         END IF;
         IF v_current THEN
           -- In flight, its lease and its TTL both ended: the key counts as absent. The row goes, so that its
           -- owner, should it still finish, finds nothing to complete.
           DELETE FROM ${t} AS k
            WHERE k.tenant_id = p_tenant AND k.key = p_key AND k.owner_token = r.owner_token
              AND k.status = 'in_flight' AND k.lease_expires_at <= now() AND k.expires_at <= now();
           IF NOT FOUND THEN
             CONTINUE;
           END IF;
         END IF;
         -- Absent, or every row of it inert: a new use of the key, in the partition of now.
         RETURN QUERY
           INSERT INTO ${t} AS k
             (tenant_id, key, fingerprint, status, owner_token, generation, attempt, lease_expires_at, expires_at, created_at,
              expiry_floor)
           VALUES (p_tenant, p_key, p_fingerprint, 'in_flight', p_owner, p_owner, 1,
                   now() + interval '1 millisecond' * p_lease_ms, now() + interval '1 millisecond' * p_ttl_ms, now(),
                   now() + interval '1 millisecond' * p_ttl_ms)
           RETURNING 'claimed'::text, k.attempt, k.generation::text, NULL::integer,
                     NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
         RETURN;
       END LOOP;
       -- Its owner kept changing the row under us: another attempt is working on this key.
       RETURN QUERY SELECT 'in_flight'::text, NULL::integer, NULL::text, 1, NULL::integer, NULL::jsonb, NULL::bytea,
         NULL::text, NULL::text;
     END
     $fn$`;
}

/**
 * The partitions' bounds, read from the catalog: one row per partition of
 * `t` with its name, whether it is the default one, and its range (null
 * bounds for the default partition or MINVALUE/MAXVALUE).
 */
function partitionsQuery(t: string): string {
  return `SELECT c.oid AS oid, c.oid::regclass::text AS name, c.reltuples AS reltuples,
            pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default,
            (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM [(]''([^'']+)''[)]'))[1]::timestamptz AS lower_bound,
            (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO [(]''([^'']+)''[)]'))[1]::timestamptz AS upper_bound
       FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
      WHERE i.inhparent = ${literal(t)}::regclass`;
}

/**
 * `<table>_make_partitions(lock_timeout_ms)`: keeps `premake` partitions ready ahead of now.
 * With the table registered in pg_partman it runs pg_partman's maintenance
 * for it; otherwise it creates the missing partitions itself, contiguous from
 * the newest, each as a table of its own then attached (ATTACH takes only
 * SHARE UPDATE EXCLUSIVE on the key table, so claims go on; it does lock the
 * default partition). A range whose rows already went to the default partition
 * (upkeep fell behind) is skipped: they stay there until the default
 * partition's sweep deletes them. Returns the partitions made.
 *
 * `lock_timeout_ms` bounds each lock wait (null: the session's): waiting
 * for the default partition's lock queues claims behind it, so the module
 * passes a short one.
 */
function makePartitionsFunction(tableName: string, layout: PartitionLayout): string {
  const t = quoteTableName(tableName);
  const name = partitionedFunction(t, 'make_partitions');
  // pg_partman's suffixes: _p2026_12_08, or _p2026_12_08_0600 for partitions shorter than a day.
  const [suffixFormat, suffixLength] = /day|week/.test(layout.interval) ? ['YYYY_MM_DD', 10] : ['YYYY_MM_DD_HH24MI', 15];
  return `CREATE OR REPLACE FUNCTION ${name}(p_lock_timeout_ms float8) RETURNS integer
     LANGUAGE plpgsql AS $fn$
     DECLARE
       v_interval interval := ${literal(layout.interval)};
       v_premake integer := ${layout.premake};
       v_schema text;
       v_relname text;
       v_partman text;
       v_registered boolean := false;
       v_before integer;
       v_newest timestamptz;
       v_from timestamptz;
       v_child text;
       v_made integer := 0;
       v_part record;
     BEGIN
       IF p_lock_timeout_ms IS NOT NULL THEN
         PERFORM set_config('lock_timeout', greatest(1, ceil(p_lock_timeout_ms))::bigint || 'ms', true);
       END IF;
       SELECT n.nspname, c.relname INTO v_schema, v_relname
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ${literal(t)}::regclass;
       SELECT e.extnamespace::regnamespace::text INTO v_partman FROM pg_extension e WHERE e.extname = 'pg_partman';
       IF v_partman IS NOT NULL THEN
         EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s.part_config WHERE parent_table = $1)', v_partman)
           INTO v_registered USING v_schema || '.' || v_relname;
       END IF;
       IF v_registered THEN
         SELECT count(*) INTO v_before FROM pg_inherits WHERE inhparent = ${literal(t)}::regclass;
         BEGIN
           EXECUTE format('SELECT %s.run_maintenance(p_parent_table := $1, p_jobmon := false)', v_partman)
             USING v_schema || '.' || v_relname;
           ${matchPartitionSettings(t)}
           RETURN (SELECT count(*) FROM pg_inherits WHERE inhparent = ${literal(t)}::regclass) - v_before;
         EXCEPTION
           WHEN lock_not_available THEN
             RAISE;
           WHEN OTHERS THEN
             -- pg_partman stops at a range whose rows went to the default partition, or when no partition is left
             -- (upkeep fell behind): the ranges after it are made below, named as pg_partman names them, and its
             -- next run carries on from the newest.
             RAISE WARNING 'pg_partman could not maintain %: % (the module makes the partitions instead)',
               v_schema || '.' || v_relname, SQLERRM;
         END;
       END IF;
       SELECT max(p.upper_bound) INTO v_newest FROM (${partitionsQuery(t)}) p WHERE NOT p.is_default;
       v_from := greatest(coalesce(v_newest, '-infinity'), date_bin(v_interval, now(), TIMESTAMPTZ '2000-01-01 00:00:00+00'));
       WHILE v_from < now() + v_interval * v_premake LOOP
         v_child := left(v_relname, ${63 - 2 - suffixLength}) || '_p' || to_char(v_from AT TIME ZONE 'UTC', '${suffixFormat}');
         BEGIN
           EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION) WITH (fillfactor = ${KEY_TABLE_FILLFACTOR})', v_schema, v_child, ${literal(t)});
           EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                          ${literal(t)}, v_schema, v_child, v_from, v_from + v_interval);
           v_made := v_made + 1;
         EXCEPTION WHEN check_violation THEN
           -- The default partition already holds rows of this range; both statements are undone.
           NULL;
         END;
         v_from := v_from + v_interval;
       END LOOP;
       RETURN v_made;
     END
     $fn$`;
}

/**
 * `<table>_retire_partition(lock_timeout_ms)`: drops the oldest partition
 * that can go, and returns its name and its estimated row count (nothing when
 * none can). A partition can go when its range is over (no claim can land in
 * it) and none of its rows is live (`RETAIN_UNTIL` in the past), which is
 * checked on the partition's index, then again under an ACCESS EXCLUSIVE lock
 * on the key table taken with `lock_timeout` = the argument: that lock waits
 * for every transaction that read or wrote the key table to end, and keeps
 * out every claim, completion and renewal until the DROP commits, so a row
 * cannot become live between the check and the drop. A long lease keeps its
 * partition: its row is live until the lease ends.
 *
 * One partition per call and per transaction, so the lock is held for one
 * catalog change; the lock wait failing (55P03) means "try again later".
 */
function retirePartitionFunction(tableName: string): string {
  const t = quoteTableName(tableName);
  return `CREATE OR REPLACE FUNCTION ${partitionedFunction(t, 'retire_partition')}(p_lock_timeout_ms float8)
     RETURNS TABLE (retired text, estimated_rows bigint)
     LANGUAGE plpgsql AS $fn$
     DECLARE
       p record;
       v_live boolean;
     BEGIN
       FOR p IN SELECT * FROM (${partitionsQuery(t)}) parts
                 WHERE NOT parts.is_default AND parts.upper_bound <= now() ORDER BY parts.upper_bound LOOP
         EXECUTE format(${LIVE_ROW_CHECK}, p.name) INTO v_live;
         CONTINUE WHEN v_live;
         PERFORM set_config('lock_timeout', greatest(1, ceil(p_lock_timeout_ms))::bigint || 'ms', true);
         EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', ${literal(t)});
         -- Every writer of the key table has ended; nothing changes until this transaction does.
         EXECUTE format(${LIVE_ROW_CHECK}, p.name) INTO v_live;
         IF v_live THEN
           RETURN;
         END IF;
         EXECUTE format('DROP TABLE %s', p.name);
         RETURN QUERY SELECT p.name, greatest(p.reltuples, 0)::bigint;
         RETURN;
       END LOOP;
     END
     $fn$`;
}

/**
 * `<table>_partition_status(limit)`: what the health check reports, in one
 * call: the partitions (not counting the default one), whether one covers
 * now (else new keys go to the default partition), how far ahead of now
 * the newest reaches and how wide it is (upkeep keeps several ahead), how
 * many ranges are over with nothing live in them (retirement keeps that at 0
 * or 1), and the rows in the default partition, counted up to `limit` (rows
 * land there only when no partition covers their time: upkeep fell behind).
 */
function partitionStatusFunction(tableName: string): string {
  const t = quoteTableName(tableName);
  return `CREATE OR REPLACE FUNCTION ${partitionedFunction(t, 'partition_status')}(p_limit integer)
     RETURNS TABLE (partitions integer, covers_now boolean, ahead_ms float8, interval_ms float8, retirable integer,
                    default_partition text, default_rows integer)
     LANGUAGE plpgsql STABLE AS $fn$
     DECLARE
       p record;
       v_live boolean;
     BEGIN
       partitions := 0;
       covers_now := false;
       retirable := 0;
       default_rows := 0;
       FOR p IN SELECT * FROM (${partitionsQuery(t)}) parts ORDER BY parts.upper_bound LOOP
         IF p.is_default THEN
           default_partition := p.name;
           EXECUTE format('SELECT count(*)::integer FROM (SELECT 1 FROM ONLY %s LIMIT $1) d', p.name)
             INTO default_rows USING p_limit;
           CONTINUE;
         END IF;
         partitions := partitions + 1;
         covers_now := covers_now OR (p.lower_bound <= now() AND now() < p.upper_bound);
         ahead_ms := extract(epoch FROM p.upper_bound - now()) * 1000;
         interval_ms := extract(epoch FROM p.upper_bound - p.lower_bound) * 1000;
         IF p.upper_bound <= now() THEN
           EXECUTE format(${LIVE_ROW_CHECK}, p.name) INTO v_live;
           IF NOT v_live THEN
             retirable := retirable + 1;
           END IF;
         END IF;
       END LOOP;
       RETURN NEXT;
     END
     $fn$`;
}

/**
 * A plpgsql snippet (it needs `v_part record` declared) that gives every
 * partition of `t` the parent's storage and compression of stored bodies
 * (`responseBodyStorage`), and the key table's fillfactor where a partition
 * has none (KEY_TABLE_FILLFACTOR; a partitioned table has no fillfactor of
 * its own to pass on, and an operator's choice on a partition stays):
 * pg_partman makes its partitions without them, and setting them on the
 * parent does not reach existing partitions. A partition whose lock is not
 * granted within the caller's `lock_timeout` keeps its settings until the
 * next upkeep.
 */
function matchPartitionSettings(t: string): string {
  return `FOR v_part IN
             SELECT * FROM (
               SELECT i.inhrelid::regclass::text AS part, p.attstorage AS storage, p.attcompression AS compression,
                      (a.attstorage, a.attcompression) IS DISTINCT FROM (p.attstorage, p.attcompression) AS body_differs,
                      NOT EXISTS (SELECT 1 FROM unnest(coalesce(c.reloptions, '{}')) o WHERE o LIKE 'fillfactor=%')
                        AS fillfactor_unset
                 FROM pg_inherits i
                 JOIN pg_class c ON c.oid = i.inhrelid
                 JOIN pg_attribute a ON a.attrelid = i.inhrelid AND a.attname = 'response_body'
                 JOIN pg_attribute p ON p.attrelid = i.inhparent AND p.attname = 'response_body'
                WHERE i.inhparent = ${literal(t)}::regclass) parts
              WHERE parts.body_differs OR parts.fillfactor_unset
           LOOP
             BEGIN
               IF v_part.body_differs THEN
                 EXECUTE format('ALTER TABLE %s ALTER COLUMN response_body SET STORAGE %s', v_part.part,
                                CASE v_part.storage WHEN 'e' THEN 'EXTERNAL' WHEN 'm' THEN 'MAIN' WHEN 'p' THEN 'PLAIN'
                                     ELSE 'EXTENDED' END);
                 IF v_part.compression = 'l' THEN
                   EXECUTE format('ALTER TABLE %s ALTER COLUMN response_body SET COMPRESSION lz4', v_part.part);
                 END IF;
               END IF;
               IF v_part.fillfactor_unset THEN
                 EXECUTE format('ALTER TABLE %s SET (fillfactor = ${KEY_TABLE_FILLFACTOR})', v_part.part);
               END IF;
             EXCEPTION WHEN lock_not_available THEN
               NULL;
             END;
           END LOOP;`;
}

/**
 * Makes the first partitions and the default partition: through pg_partman's
 * `create_parent` (4.x API: native, `infinite_time_partitions` so its
 * maintenance premakes from now rather than scanning for the newest row, no
 * retention: only the module knows when a row is past its TTL and lease), or
 * with the module's own `make_partitions`. Skipped when already done.
 */
function registerPartitions(tableName: string, layout: PartitionLayout): string {
  const t = quoteTableName(tableName);
  const wantPartman = layout.partman === 'auto' ? 'NULL' : layout.partman ? 'true' : 'false';
  return `DO $do$
     DECLARE
       v_parent text;
       v_partman text;
       v_registered boolean := false;
       v_want boolean := ${wantPartman};
       v_part record;
     BEGIN
       SELECT n.nspname || '.' || c.relname INTO v_parent
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ${literal(t)}::regclass;
       SELECT e.extnamespace::regnamespace::text INTO v_partman FROM pg_extension e WHERE e.extname = 'pg_partman';
       IF v_want AND v_partman IS NULL THEN
         RAISE EXCEPTION 'pg_partman is not installed in this database (CREATE EXTENSION pg_partman SCHEMA partman)';
       END IF;
       IF v_partman IS NOT NULL THEN
         EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s.part_config WHERE parent_table = $1)', v_partman)
           INTO v_registered USING v_parent;
         IF v_registered AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = ${literal(t)}::regclass) THEN
           -- pg_partman's record of an earlier table of this name, dropped without it: start afresh.
           EXECUTE format('DELETE FROM %s.part_config WHERE parent_table = $1', v_partman) USING v_parent;
           v_registered := false;
         END IF;
       END IF;
       IF v_partman IS NOT NULL AND coalesce(v_want, true) AND NOT v_registered
          AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = ${literal(t)}::regclass) THEN
         EXECUTE format('SELECT %s.create_parent(p_parent_table := $1, p_control := ''created_at'', p_type := ''native'',
                           p_interval := $2, p_premake := $3, p_start_partition := $4, p_jobmon := false)', v_partman)
           USING v_parent, ${literal(layout.interval)}, ${layout.premake},
                 date_bin(${literal(layout.interval)}::interval, now(), TIMESTAMPTZ '2000-01-01 00:00:00+00')::text;
         EXECUTE format('UPDATE %s.part_config SET infinite_time_partitions = true, retention = NULL WHERE parent_table = $1',
                        v_partman) USING v_parent;
         ${matchPartitionSettings(t)}
       ELSIF NOT v_registered THEN
         EXECUTE format('CREATE TABLE IF NOT EXISTS %s PARTITION OF %s DEFAULT WITH (fillfactor = ${KEY_TABLE_FILLFACTOR})',
                        ${literal(quoteTableName(`${tableName}_default`))}, ${literal(t)});
         PERFORM ${partitionedFunction(t, 'make_partitions')}(NULL);
       END IF;
     END
     $do$`;
}

/**
 * The store's statements for the partitioned table's retention and health;
 * `t` is the quoted table name. Per-key statements are the plain table's.
 */
export function partitionedRetentionStatements(t: string) {
  return {
    makePartitions: `${sqlMarker('make-partitions')} SELECT ${partitionedFunction(t, 'make_partitions')}($1) AS made`,
    retirePartition: `${sqlMarker('retire-partition')} SELECT * FROM ${partitionedFunction(t, 'retire_partition')}($1)`,
    /** The default partition's name, if there is one. */
    defaultPartition: `${sqlMarker('default-partition')} SELECT p.name FROM (${partitionsQuery(t)}) p WHERE p.is_default`,
    /**
     * Rows that landed in the default partition (no partition covered their
     * time): deleted row by row like the plain sweeper does, in batches of
     * $1, the expired ones only, found along the retention index (a row's
     * bound is at most its expiry, or its lease where that ends later: such a
     * row goes once its lease ended too). `%s` is the default partition.
     */
    sweepDefault: (defaultPartition: string) => `${sqlMarker('sweep-default-partition')}
      WITH doomed AS (
        SELECT tenant_id, key, created_at FROM ONLY ${defaultPartition} k
         WHERE ${retentionBound('k')} <= now() AND ${retainUntil('k')} <= now()
         LIMIT $1
         FOR UPDATE SKIP LOCKED
      )
      DELETE FROM ONLY ${defaultPartition} AS k USING doomed
       WHERE k.tenant_id = doomed.tenant_id AND k.key = doomed.key AND k.created_at = doomed.created_at
         AND ${retainUntil('k')} <= now()`,
    /** Expired rows in the default partition, counted up to $1 (the health check's backlog). */
    countExpiredDefault: (defaultPartition: string) => `${sqlMarker('count-expired')}
      SELECT count(*)::integer AS expired FROM (
        SELECT 1 FROM ONLY ${defaultPartition} k
         WHERE ${retentionBound('k')} <= now() AND ${retainUntil('k')} <= now() LIMIT $1) AS backlog`,
    /** The partitions as the health check sees them (see `partitionStatusFunction`); $1 bounds the default partition's count. */
    status: `${sqlMarker('partition-status')} SELECT * FROM ${partitionedFunction(t, 'partition_status')}($1)`,
  } as const;
}
