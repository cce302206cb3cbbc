import { sqlMarker } from './sql-marker.js';
import { quoteTableName } from './identifiers.js';
import { dialectParts, type FunctionDialect } from './function-dialect.js';
import {
  CLAIM_FUNCTION_SIGNATURE,
  EXPIRY_FLOOR_SLACK,
  FENCE_LOST_SQLSTATE,
  HELD_ELSEWHERE,
  KEY_FUNCTIONS_VERSION,
  keyLock,
  keyStoreFunction as fn,
} from './key-function-parts.sql.js';

/**
 * Claim mode `request-transaction`: the claim joins the request's transaction and its completion commits with
 * the work, so a new key is written once, completed. The store calls these beside the ordinary claim and
 * completion (key-store.sql.ts), which a new key of the default mode runs alone. Parameters as in keyStoreStatements.
 *
 * @param t the table name, already quoted (`quoteTableName`)
 * @param tableName the same, as given (it seeds the key's lock: see `keyLock`)
 */
export function requestTransactionKeyStatements(t: string, tableName: string) {
  return {
    // A request-transaction attempt on one server letting go of the key's lock it held for its session (see
    // HOLD_FOR_SESSION) when it ends without its completion: $1 tenant, $2 key.
    releaseKeyLock: `${sqlMarker('release-key')} SELECT pg_advisory_unlock(${keyLock(tableName, '$1::text', '$2::text')}) AS released`,
    // request-transaction mode (see keyStoreFunctions): $1-$7 as claim.
    claimInTransaction: `${sqlMarker('claim')} SELECT * FROM ${fn(t, 'claim_in_transaction')}($1, $2, $3, $4::uuid, $5, $6, $7)`,
    // The completion of a claim_in_transaction claim: $1-$4 tenant, key, fingerprint, owner token, $5-$8 as complete's $4-$7.
    completeInTransaction: `${sqlMarker('complete')} SELECT ${fn(t, 'complete_in_transaction')}($1, $2, $3, $4::uuid, $5, $6::jsonb, $7, $8) AS completed`,
  } as const;
}

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
 * `claim_in_transaction` and `complete_in_transaction`, the functions of claim mode `request-transaction`, created
 * with the completion functions (`completionFunctions`) on either table; the partitioned table's store calls
 * neither (its one claim takes both modes).
 */
export function requestTransactionKeyFunctions(tableName: string, dialect: FunctionDialect = 'postgres'): string[] {
  const t = quoteTableName(tableName);
  const { now, declare, guard, attributes } = dialectParts(dialect, tableName);
  // One server: a request-transaction claim keeps the key's lock for its session too (see HOLD_FOR_SESSION). On
  // Citus the functions run on the worker's connections, which Citus caches and lends to other sessions: there the
  // lock stays transaction-level and the store keeps a stored failure final with a savepoint instead.
  const sessionHold = dialect === 'postgres';
  return [
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
             -- retry_after carries the seconds the record has left, by this clock, as the ordinary claim's does.
             RETURN QUERY SELECT 'completed'::text, r.attempt, NULL::text,
               least(floor(extract(epoch FROM (r.expires_at - now()))), 2147483647)::integer,
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
  ];
}
