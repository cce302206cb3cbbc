import { sqlMarker } from './redacting-logger.js';
import { quoteTableName } from './identifiers.js';
import { dialectParts, type FunctionDialect } from './function-dialect.js';

/**
 * The key store's statements, one per cell group of the state table:
 *
 * | key state when the request arrives | same fingerprint          | different fingerprint |
 * | ---------------------------------- | ------------------------- | --------------------- |
 * | absent, or expired (swept or not)  | claim, new owner token    | -                     |
 * | in flight, lease valid             | 409, Retry-After = lease  | 422                   |
 * | in flight, lease expired           | take over, new owner token| 422                   |
 * | completed                          | replay the stored response| 422                   |
 *
 * "Expired" is `expires_at <= now()` unless the lease is still valid: a key
 * whose lease runs is never absent, whatever its TTL. Every comparison uses
 * the database clock. `claim` answers the whole table in one atomic
 * statement, committed on its own (at READ COMMITTED, whatever the server's
 * default: see the store); `complete` is fenced by the owner token inside
 * the work's transaction. What no new key sends (the heartbeat, phases,
 * releases, the sweeper's batches) is in key-upkeep.sql.ts.
 *
 * Parameters: claim ($1 tenant, $2 key, $3 fingerprint, $4 owner token,
 * $5 lease ms, $6 ttl ms, $7 lock timeout ms, or null for a separate claim,
 * which then writes only at READ COMMITTED); complete ($1-$3
 * tenant, key, owner token, $4 status, $5 headers, $6 body, $7 ttl ms).
 *
 * @param t the table name, already quoted (`quoteTableName`)
 * @param tableName the same, as given (it seeds the key's lock: see `keyLock`)
 */
export function keyStoreStatements(t: string, tableName: string) {
  return {
    // A separate attempt's transaction holding the key's lock (see the store's holdKeyLockStatement): $1 tenant, $2 key.
    holdKeyLock: `${sqlMarker('hold-key')} SELECT pg_try_advisory_xact_lock(${keyLock(tableName, '$1::text', '$2::text')}) AS locked`,
    // A request-transaction attempt on one server letting go of the key's lock it held for its session (see
    // HOLD_FOR_SESSION) when it ends without its completion: $1 tenant, $2 key.
    releaseKeyLock: `${sqlMarker('release-key')} SELECT pg_advisory_unlock(${keyLock(tableName, '$1::text', '$2::text')}) AS released`,
    // One round trip answers every cell of the state table: a short call of
    // the claim function (see keyStoreFunctions), whose statements PostgreSQL
    // plans once per connection. Unnamed, so PgBouncer in transaction pooling
    // needs nothing. $7 is a lock timeout in ms (request-transaction mode), or null (separate).
    claim: `${sqlMarker('claim')} SELECT * FROM ${fn(t, 'claim')}($1, $2, $3, $4::uuid, $5, $6, $7)`,
    complete: `${sqlMarker('complete')} SELECT ${fn(t, 'complete')}($1, $2, $3::uuid, $4, $5::jsonb, $6, $7) AS completed`,
    // The same, raising FENCE_LOST_SQLSTATE instead of answering false: for a completion followed by COMMIT.
    completeOrRaise: `${sqlMarker('complete')} SELECT ${fn(t, 'complete_or_raise')}($1, $2, $3::uuid, $4, $5::jsonb, $6, $7) AS completed`,
    // request-transaction mode (see keyStoreFunctions): $1-$7 as claim.
    claimInTransaction: `${sqlMarker('claim')} SELECT * FROM ${fn(t, 'claim_in_transaction')}($1, $2, $3, $4::uuid, $5, $6, $7)`,
    // The completion of a claim_in_transaction claim: $1-$4 tenant, key, fingerprint, owner token, $5-$8 as complete's $4-$7.
    completeInTransaction: `${sqlMarker('complete')} SELECT ${fn(t, 'complete_in_transaction')}($1, $2, $3, $4::uuid, $5, $6::jsonb, $7, $8) AS completed`,
  } as const;
}

type KeyStoreFunction = 'claim' | 'complete' | 'complete_or_raise' | 'claim_in_transaction' | 'complete_in_transaction';

/** A function of the key table, named after it and in its schema: `"billing"."payment_keys_claim"`. */
export function keyStoreFunction(quotedTable: string, name: KeyStoreFunction): string {
  return `${quotedTable.slice(0, -1)}_${name}"`;
}
const fn = keyStoreFunction;

/** The key table's functions, quoted as the store calls them. */
export function keyStoreFunctionNames(tableName: string): string[] {
  const t = quoteTableName(tableName);
  return [
    fn(t, 'claim'),
    fn(t, 'complete'),
    fn(t, 'complete_or_raise'),
    fn(t, 'claim_in_transaction'),
    fn(t, 'complete_in_transaction'),
  ];
}

/**
 * SQLSTATE the completion raises when its fence fails (`complete_or_raise`):
 * the key is no longer this attempt's. An error, not a false result, so that a
 * COMMIT sent in the same message never runs after it.
 */
export const FENCE_LOST_SQLSTATE = 'NI409';

/**
 * The functions the claim and the completion call, created by the key
 * table's migration after the table. PL/pgSQL caches the plans of its
 * statements per connection, so a call costs a short parse and the plan is
 * reused, with no client-side prepared statement (which PgBouncer before
 * 1.21 breaks in transaction pooling).
 *
 * The claim reads the row first and decides without locking it whenever the
 * answer is plain (a valid lease, a stored response, another fingerprint), so
 * replays, 409s and 422s take no row lock and write no WAL. Otherwise it
 * inserts, or takes the row over when it expired or its lease lapsed with the
 * same fingerprint, re-checking on the locked, latest row version. A row
 * that changed between the read and the write (a concurrent claim committed
 * meanwhile) is read again, up to three times; every statement of a
 * PL/pgSQL function sees rows committed before it started.
 *
 * On one server the dialect's parts (function-dialect.ts) are `now()` and
 * `clock_timestamp()`, with nothing declared and no guard; the Citus texts
 * read the clocks into variables and check where they run.
 *
 * @param tableName the key table, possibly schema-qualified
 */
export function keyStoreFunctions(tableName: string, dialect: FunctionDialect = 'postgres'): string[] {
  return [claimFunction(tableName, dialect), ...completionFunctions(tableName, dialect)];
}

/**
 * The parameters and result columns of every claim function (the plain
 * table's `claim` and `claim_in_transaction`, the partitioned table's
 * `claim`): the store calls them alike and reads each result row the same way.
 */
export const CLAIM_FUNCTION_SIGNATURE = `(
       p_tenant text, p_key text, p_fingerprint text, p_owner uuid, p_lease_ms float8, p_ttl_ms float8, p_lock_timeout_ms float8)
     RETURNS TABLE (state text, attempt integer, generation text, retry_after integer, response_status integer,
                    response_headers jsonb, response_body bytea, recovery_point text, phase_results text)`;

/**
 * Marks the claim functions of this version (a comment in their source): the
 * start-up check refuses functions an older version created, which lack the
 * key's lock, the isolation handling, the expiry floor or the request-transaction
 * claim's session hold (version 4) or the claim's own isolation check (version 5) the store now relies on.
 */
export const KEY_FUNCTIONS_VERSION = 'nest-idempotency-pg key functions 5';

/**
 * The claim's state when it would have to write under a snapshot older than its own statement: it ran alone, as
 * its own transaction, on a connection whose default isolation is REPEATABLE READ or SERIALIZABLE. Nothing was
 * written; the store sends the claim again inside `BEGIN ISOLATION LEVEL READ COMMITTED`. (Read-only answers, a
 * replay, a 409 or a 422, are right under any snapshot taken at the statement's start: they stand.)
 */
export const READ_COMMITTED_NEEDED = 'read_committed_needed';

/**
 * The plain table's claim on one server, before it writes: only READ COMMITTED may write here, since a snapshot
 * older than the statement would miss a claim committed meanwhile. The store sends that claim alone (its own
 * implicit transaction, two statements fewer than BEGIN and COMMIT around it); on a connection whose default is
 * another level it writes nothing and asks to be sent again in a READ COMMITTED transaction. The check is for the
 * claims the store sends, with a null lock timeout (`$7`); claim_in_transaction calls this function with one, from
 * inside the work's transaction, where it must write at whatever level that runs (see there). On Citus the store
 * always sends the claim inside a transaction, and the text has no such check.
 */
const READ_COMMITTED_ONLY = `IF p_lock_timeout_ms IS NULL
            AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
           RETURN QUERY SELECT '${READ_COMMITTED_NEEDED}'::text, NULL::integer, NULL::text, NULL::integer, NULL::integer,
             NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
           RETURN;
         END IF;`;

/**
 * How long after `greatest(expiry_floor, lease_expires_at)` a completed row
 * may still expire, a SQL interval.
 *
 * `expiry_floor` is the column the retention indexes read instead of
 * `expires_at`: a completion changes `expires_at` (TTL after the response is
 * stored), and an index on it would make every completion insert into every
 * index of the table. Every writer keeps, for each row:
 *
 * - `expiry_floor <= expires_at`: the claim (and a takeover) sets both to
 *   claim + TTL, and a completion moves only `expires_at`, later. So a row
 *   never expires before its floor, and the plain sweeper finds every expired
 *   row among those whose floor has passed (`sweepBatch`).
 * - on an in-flight row `expires_at = expiry_floor`, so it must be kept until
 *   exactly `greatest(expiry_floor, lease_expires_at)`; on a completed row
 *   `expires_at <= greatest(expiry_floor, lease_expires_at) + EXPIRY_FLOOR_SLACK`:
 *   a completion later than the slack after its claim (a rare, slow handler)
 *   moves the floor to its expiry, in the same (then not HOT) update. The
 *   partitioned table's retirement relies on it: no row of a partition can be
 *   live once that bound plus the slack is past.
 *
 * A handler that runs longer than this completes with an ordinary update; a
 * longer slack would make the retirement check walk more rows (see
 * `liveRowQuery`).
 */
export const EXPIRY_FLOOR_SLACK = "interval '1 minute'";

/** The plain table's claim function (see `keyStoreFunctions`): claim mode `separate`, and takeovers. */
function claimFunction(tableName: string, dialect: FunctionDialect = 'postgres'): string {
  const t = quoteTableName(tableName);
  const { now, declare, guard, attributes } = dialectParts(dialect, tableName);
  return `CREATE OR REPLACE FUNCTION ${fn(t, 'claim')}${CLAIM_FUNCTION_SIGNATURE}
     LANGUAGE plpgsql${attributes} AS $fn$
     -- ${KEY_FUNCTIONS_VERSION}
     DECLARE
       r ${t}%ROWTYPE;${declare ? `\n       ${declare}` : ''}
     BEGIN
       ${guard}FOR i IN 1..3 LOOP
         SELECT * INTO r FROM ${t} k WHERE k.tenant_id = p_tenant AND k.key = p_key;
         IF FOUND THEN
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
         ${
           dialect === 'postgres'
             ? `${READ_COMMITTED_ONLY}
         `
             : ''
         }-- About to write. An attempt claimed in request-transaction mode holds the key's lock until its
         -- transaction ends and may have written nothing yet: while it runs, the key is in flight, whatever
         -- this claim reads. (Re-entrant: a takeover by claim_in_transaction already holds the lock.)
         IF NOT pg_try_advisory_xact_lock(${keyLock(tableName)}) THEN
           ${HELD_ELSEWHERE}
           RETURN;
         END IF;
         RETURN QUERY
           INSERT INTO ${t} AS k
             (tenant_id, key, fingerprint, status, owner_token, generation, attempt, lease_expires_at, expires_at, created_at,
              expiry_floor)
           VALUES (p_tenant, p_key, p_fingerprint, 'in_flight', p_owner, p_owner, 1,
                   ${now} + interval '1 millisecond' * p_lease_ms, ${now} + interval '1 millisecond' * p_ttl_ms, ${now},
                   ${now} + interval '1 millisecond' * p_ttl_ms)
           ON CONFLICT (tenant_id, key) DO UPDATE SET
             fingerprint = EXCLUDED.fingerprint,
             status = 'in_flight',
             owner_token = EXCLUDED.owner_token,
             attempt = CASE WHEN k.expires_at <= ${now} THEN 1 ELSE k.attempt + 1 END,
             -- Downstream keys derive from the generation: the same for a takeover (it finishes the
             -- same work), new for a key reused after it expired (new work).
             generation = CASE WHEN k.expires_at <= ${now} THEN EXCLUDED.generation
                               ELSE coalesce(k.generation, EXCLUDED.generation) END,
             lease_expires_at = EXCLUDED.lease_expires_at,
             expires_at = EXCLUDED.expires_at,
             expiry_floor = EXCLUDED.expiry_floor,
             created_at = ${now},
             completed_at = NULL,
             response_status = NULL,
             response_headers = NULL,
             response_body = NULL,
             -- A takeover resumes the phases its predecessor recorded; a fresh claim of an expired key starts over.
             recovery_point = CASE WHEN k.expires_at <= ${now} THEN NULL ELSE k.recovery_point END,
             phase_results = CASE WHEN k.expires_at <= ${now} THEN NULL ELSE k.phase_results END
           WHERE NOT (k.status = 'in_flight' AND k.lease_expires_at > ${now})
             AND (k.expires_at <= ${now} OR (k.status = 'in_flight' AND k.fingerprint = EXCLUDED.fingerprint))
           RETURNING 'claimed'::text, k.attempt, k.generation::text, NULL::integer,
                     NULL::integer, NULL::jsonb, NULL::bytea, k.recovery_point, k.phase_results;
         IF FOUND THEN
           RETURN;
         END IF;
       END LOOP;
       -- The row kept changing under us: another attempt is working on this key.
       RETURN QUERY SELECT 'in_flight'::text, NULL::integer, NULL::text, 1, NULL::integer, NULL::jsonb, NULL::bytea,
         NULL::text, NULL::text;
     END
     $fn$`;
}

/**
 * The key's advisory lock, as a plpgsql expression of `p_tenant` and `p_key`:
 * chained hashes (no two pairs are joined into one string), seeded with the
 * table, so the same key in two key tables (two modules) never makes one
 * wait for the other. A hash collision only makes two keys wait for each
 * other.
 */
export function keyLock(tableName: string, tenant = 'p_tenant', key = 'p_key'): string {
  const seed = `nest-idempotency:key:${tableName}`.replace(/'/g, "''");
  return `hashtextextended(${key}, hashtextextended(${tenant}, hashtextextended('${seed}', 0)))`;
}

/**
 * The claim's answer when another attempt holds the key's lock: in flight,
 * for about a lease (its own lease is not known here).
 */
export const HELD_ELSEWHERE = `RETURN QUERY SELECT 'in_flight'::text, NULL::integer, NULL::text,
             greatest(1, ceil(p_lease_ms / 1000))::integer, NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;`;

/**
 * Waits for the key's lock, held by another attempt, at most
 * `p_lock_timeout_ms` (claim mode `request-transaction`; plpgsql statements of
 * a function that declares `v_lock bigint` and `v_lock_timeout text`, the
 * session's lock_timeout). A wait that times out is an ordinary 409, answered
 * here: caught in its block, the error never reaches the server's log. (The
 * block is a subtransaction, paid only by a claim that has to wait.)
 */
export const WAIT_FOR_KEY_LOCK = `BEGIN
           PERFORM set_config('lock_timeout', greatest(1, ceil(coalesce(p_lock_timeout_ms, 0)))::bigint || 'ms', true);
           PERFORM pg_advisory_xact_lock(v_lock);
         EXCEPTION WHEN lock_not_available THEN
           PERFORM set_config('lock_timeout', v_lock_timeout, true);
           ${HELD_ELSEWHERE}
           RETURN;
         END;
         PERFORM set_config('lock_timeout', v_lock_timeout, true);`;

/**
 * What a request-transaction claim on one server does once the key is its own (claim_in_transaction, which holds
 * the key's transaction-level lock by then): it takes the same lock for its session too, at once (a session's
 * holds of one lock never wait for each other). A failure whose answer is stored then rolls the work back with
 * `ROLLBACK AND CHAIN` and completes the key in the chained transaction: the session hold spans the moment between
 * them, so a duplicate waiting on the lock never finds the key free, with no savepoint (a subtransaction) in the
 * request. The completion hands the hold back to its transaction (HAND_SESSION_HOLD_TO_TRANSACTION), and every
 * other end of the attempt releases it (the store's `releaseKeyLock`) or ends its connection.
 */
const HOLD_FOR_SESSION = 'PERFORM pg_advisory_lock(v_lock);';

/**
 * The first step of complete_in_transaction on one server: the key's lock, held for the session since the claim,
 * is held by the completion's transaction instead, so it is released at that transaction's COMMIT or ROLLBACK,
 * whichever ends it, and never outlives it on a pooled connection. A transaction that cannot take the lock at once
 * is not the key's holder: the fence fails.
 */
const HAND_SESSION_HOLD_TO_TRANSACTION = `IF NOT pg_try_advisory_xact_lock(v_lock) THEN
         RAISE EXCEPTION 'the idempotency key is no longer this attempt''s' USING ERRCODE = '${FENCE_LOST_SQLSTATE}';
       END IF;
       PERFORM pg_advisory_unlock(v_lock);`;

/**
 * The completion functions: a fenced UPDATE by tenant, key and owner token,
 * the same on the plain and the partitioned table (where it finds the row in
 * whichever partition holds it).
 */
export function completionFunctions(tableName: string, dialect: FunctionDialect = 'postgres'): string[] {
  const t = quoteTableName(tableName);
  const { now, declare, guard, attributes } = dialectParts(dialect, tableName);
  // One server: a request-transaction claim keeps the key's lock for its session too (see HOLD_FOR_SESSION). On
  // Citus the functions run on the worker's connections, which Citus caches and lends to other sessions: there the
  // lock stays transaction-level and the store keeps a stored failure final with a savepoint instead.
  const sessionHold = dialect === 'postgres';
  return [
    `CREATE OR REPLACE FUNCTION ${fn(t, 'complete')}(
       p_tenant text, p_key text, p_owner uuid, p_status integer, p_headers jsonb, p_body bytea, p_ttl_ms float8)
     RETURNS boolean
     LANGUAGE plpgsql${attributes} AS $fn$
     DECLARE
       -- Inside the work's transaction, whose now() is when it began: the TTL counts from this write instead.
       v_stored timestamptz := clock_timestamp();
       v_expires timestamptz := v_stored + interval '1 millisecond' * p_ttl_ms;
       -- The expiry less the slack, worked out here: timestamptz + interval is STABLE, and Citus refuses any
       -- function that is not IMMUTABLE in a CASE of a statement on a distributed table.
       v_expires_less_slack timestamptz := v_expires - ${EXPIRY_FLOOR_SLACK};${declare ? `\n       ${declare}` : ''}
     BEGIN
       ${guard}-- Changes no indexed column, so PostgreSQL can write the completed row as a HOT update beside the claimed
       -- one (the fillfactor leaves room): expiry_floor stays, unless this completion comes so long after its claim
       -- that the floor must follow (see EXPIRY_FLOOR_SLACK).
       UPDATE ${t}
          SET status = 'completed', response_status = p_status, response_headers = p_headers, response_body = p_body,
              completed_at = v_stored, expires_at = v_expires,
              expiry_floor = CASE WHEN v_expires_less_slack > greatest(expiry_floor, lease_expires_at)
                                  THEN v_expires ELSE expiry_floor END
        WHERE tenant_id = p_tenant AND key = p_key AND owner_token = p_owner AND status = 'in_flight';
       RETURN FOUND;
     END
     $fn$`,
    // request-transaction mode: nobody needs to see an in-flight row that only this transaction could ever commit,
    // so under READ COMMITTED a new key is written once, completed, by complete_in_transaction. The claim reads first:
    // a replay, a 409 for an attempt of the other mode, a 422 take no lock. To claim, it takes the key's lock
    // (waiting for an attempt that holds it: see WAIT_FOR_KEY_LOCK), reads again what the holder committed, and
    // decides. An in-flight row whose lease lapsed (whatever its TTL) is taken over in place at once, by the ordinary
    // claim, so that its old owner's completion is fenced from this moment on. A claim of the other mode writes only
    // under the same lock, so it never starts while this one runs.
    //
    // Under REPEATABLE READ or SERIALIZABLE (the data source's, or a default of the server, the database, the role or
    // the connection) the transaction's snapshot was taken when this statement began, before it held the lock: what
    // the key's previous holder committed since is invisible to every read of it. There the claim writes the
    // in-flight row at once, through the ordinary claim: its INSERT ... ON CONFLICT meets the row the snapshot
    // misses and fails with a serialization failure (40001), and the store starts the transaction again, with a
    // snapshot that sees that row (a replay, then read without the lock).
    `CREATE OR REPLACE FUNCTION ${fn(t, 'claim_in_transaction')}${CLAIM_FUNCTION_SIGNATURE}
     LANGUAGE plpgsql${attributes} AS $fn$
     -- ${KEY_FUNCTIONS_VERSION}
     DECLARE
       r ${t}%ROWTYPE;${sessionHold ? '\n       c record;' : ''}
       v_found boolean;
       v_lock bigint := ${keyLock(tableName)};
       v_lock_timeout text := current_setting('lock_timeout');
     BEGIN
       ${guard}FOR i IN 1..2 LOOP
         SELECT * INTO r FROM ${t} k WHERE k.tenant_id = p_tenant AND k.key = p_key;
         v_found := FOUND;
         IF v_found AND r.status = 'in_flight' AND r.lease_expires_at > now() THEN
           RETURN QUERY SELECT CASE WHEN r.fingerprint = p_fingerprint THEN 'in_flight' ELSE 'mismatch' END, r.attempt,
             NULL::text, greatest(1, ceil(extract(epoch FROM (r.lease_expires_at - now()))))::integer,
             NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
           RETURN;
         ELSIF v_found AND r.status = 'completed' AND r.expires_at > now() THEN
           IF r.fingerprint <> p_fingerprint THEN
             RETURN QUERY SELECT 'mismatch'::text, r.attempt, NULL::text, NULL::integer,
               NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
           ELSE
             RETURN QUERY SELECT 'completed'::text, r.attempt, NULL::text, NULL::integer,
               r.response_status, r.response_headers, r.response_body, NULL::text, NULL::text;
           END IF;
           RETURN;
         END IF;
         EXIT WHEN i = 2;
         -- Read again once the lock is held, also when it was free at once: a holder may have committed and let go
         -- of it between the read above and now, and this claim must see what it committed.
         CONTINUE WHEN pg_try_advisory_xact_lock(v_lock);
         ${WAIT_FOR_KEY_LOCK}
         -- The next statement reads what the holder committed (READ COMMITTED; under a stricter level, see above).
       END LOOP;
       IF (v_found AND r.status = 'in_flight') OR current_setting('transaction_isolation') <> 'read committed' THEN
         -- Its lease lapsed: taken over in place (or claimed anew when its TTL ended too), as the ordinary claim does;
         -- or, under a stricter isolation level, any claim: written now (see above). A lock timeout that is not null
         -- tells the ordinary claim it runs inside this transaction, where it may write at any level.
         ${
           sessionHold
             ? `SELECT * INTO c FROM ${fn(t, 'claim')}(p_tenant, p_key, p_fingerprint, p_owner, p_lease_ms, p_ttl_ms, coalesce(p_lock_timeout_ms, 0)) AS x;
         IF c.state = 'claimed' THEN
           ${HOLD_FOR_SESSION}
         END IF;
         RETURN QUERY SELECT c.state, c.attempt, c.generation, c.retry_after, c.response_status, c.response_headers,
           c.response_body, c.recovery_point, c.phase_results;`
             : `RETURN QUERY SELECT * FROM ${fn(t, 'claim')}(p_tenant, p_key, p_fingerprint, p_owner, p_lease_ms, p_ttl_ms, coalesce(p_lock_timeout_ms, 0));`
         }
         RETURN;
       END IF;
       -- Absent, or completed and expired: this attempt's, with nothing written until its completion.${
         sessionHold
           ? `
       ${HOLD_FOR_SESSION}`
           : ''
       }
       RETURN QUERY SELECT 'claimed'::text, 1, p_owner::text, NULL::integer,
         NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
     END
     $fn$`,
    // The completion of a request-transaction claim: inserts the completed row (a key claimed without a
    // write), or completes the attempt's own in-flight row (a takeover), or replaces an expired row. Anything
    // else means another attempt holds or completed the key: the fence fails, raised so that no COMMIT follows.
    `CREATE OR REPLACE FUNCTION ${fn(t, 'complete_in_transaction')}(
       p_tenant text, p_key text, p_fingerprint text, p_owner uuid, p_status integer, p_headers jsonb, p_body bytea,
       p_ttl_ms float8)
     RETURNS boolean
     LANGUAGE plpgsql${attributes} AS $fn$
     DECLARE
       v_stored timestamptz := clock_timestamp();
       v_expires timestamptz := v_stored + interval '1 millisecond' * p_ttl_ms;
       v_expires_less_slack timestamptz := v_expires - ${EXPIRY_FLOOR_SLACK};${declare ? `\n       ${declare}` : ''}${
         sessionHold ? `\n       v_lock bigint := ${keyLock(tableName)};` : ''
       }
     BEGIN
       ${guard}${sessionHold ? `${HAND_SESSION_HOLD_TO_TRANSACTION}\n       ` : ''}INSERT INTO ${t} AS k
         (tenant_id, key, fingerprint, status, owner_token, generation, attempt, lease_expires_at, expires_at, created_at,
          completed_at, response_status, response_headers, response_body, expiry_floor)
       VALUES (p_tenant, p_key, p_fingerprint, 'completed', p_owner, p_owner, 1, ${now},
               v_expires, ${now}, v_stored, p_status, p_headers, p_body, v_expires)
       ON CONFLICT (tenant_id, key) DO UPDATE SET
         status = 'completed',
         fingerprint = EXCLUDED.fingerprint,
         owner_token = EXCLUDED.owner_token,
         generation = CASE WHEN k.owner_token = EXCLUDED.owner_token THEN k.generation${
           sessionHold
             ? `\n                           WHEN k.status = 'in_flight' AND k.expires_at > ${now} THEN coalesce(k.generation, EXCLUDED.generation)`
             : ''
         } ELSE EXCLUDED.generation END,
         attempt = CASE WHEN k.owner_token = EXCLUDED.owner_token THEN k.attempt${
           sessionHold ? `\n                        WHEN k.status = 'in_flight' AND k.expires_at > ${now} THEN k.attempt + 1` : ''
         } ELSE 1 END,
         created_at = CASE WHEN k.owner_token = EXCLUDED.owner_token THEN k.created_at ELSE ${now} END,
         lease_expires_at = ${now},
         expires_at = EXCLUDED.expires_at,
         -- This attempt's own in-flight row (a takeover) keeps its floor, as the ordinary completion does.
         expiry_floor = CASE WHEN k.owner_token = EXCLUDED.owner_token
                              AND v_expires_less_slack <= k.expiry_floor
                             THEN k.expiry_floor ELSE EXCLUDED.expiry_floor END,
         completed_at = EXCLUDED.completed_at,
         response_status = EXCLUDED.response_status,
         response_headers = EXCLUDED.response_headers,
         response_body = EXCLUDED.response_body,
         recovery_point = NULL,
         phase_results = NULL
       WHERE (k.owner_token = EXCLUDED.owner_token AND k.status = 'in_flight')
          OR (k.expires_at <= ${now} AND NOT (k.status = 'in_flight' AND k.lease_expires_at > ${now}))${
            sessionHold
              ? `
          -- A takeover its ROLLBACK undid (a failure whose answer is stored, after ROLLBACK AND CHAIN): the row is its
          -- lapsed predecessor's again, and this attempt still holds the key's lock, so nobody else has claimed it.
          OR (k.status = 'in_flight' AND k.lease_expires_at <= ${now} AND k.fingerprint = EXCLUDED.fingerprint)`
              : ''
          };
       IF NOT FOUND THEN
         RAISE EXCEPTION 'the idempotency key is no longer this attempt''s' USING ERRCODE = '${FENCE_LOST_SQLSTATE}';
       END IF;
       RETURN true;
     END
     $fn$`,
    // The completion sent with its COMMIT in one message: a failed fence must stop that COMMIT.
    `CREATE OR REPLACE FUNCTION ${fn(t, 'complete_or_raise')}(
       p_tenant text, p_key text, p_owner uuid, p_status integer, p_headers jsonb, p_body bytea, p_ttl_ms float8)
     RETURNS boolean
     LANGUAGE plpgsql${attributes} AS $fn$
     BEGIN
       ${guard}IF NOT ${fn(t, 'complete')}(p_tenant, p_key, p_owner, p_status, p_headers, p_body, p_ttl_ms) THEN
         RAISE EXCEPTION 'the idempotency key is no longer this attempt''s' USING ERRCODE = '${FENCE_LOST_SQLSTATE}';
       END IF;
       RETURN true;
     END
     $fn$`,
  ];
}
