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
import { requestTransactionKeyFunctions, requestTransactionKeyStatements } from './request-transaction-key.sql.js';

/**
 * The default mode's statements: `claim` answers the whole state table (docs/requests.md) in one atomic call, by
 * the database clock; `complete` is fenced by the owner token. Parameters: claim ($1 tenant, $2 key, $3 fingerprint,
 * $4 owner token, $5 lease ms, $6 ttl ms, $7 lock timeout ms, null for a separate claim); complete ($1-$3 tenant,
 * key, owner token, $4 status, $5 headers, $6 body, $7 ttl ms). `t` is `tableName` quoted.
 */
export function keyStoreStatements(t: string, tableName: string) {
  return {
    // The key's lock for a separate attempt's transaction: $1 tenant, $2 key.
    holdKeyLock: `${sqlMarker('hold-key')} SELECT pg_try_advisory_xact_lock(${keyLock(tableName, '$1::text', '$2::text')}) AS locked`,
    claim: `${sqlMarker('claim')} SELECT * FROM ${fn(t, 'claim')}($1, $2, $3, $4::uuid, $5, $6, $7)`,
    complete: `${sqlMarker('complete')} SELECT ${fn(t, 'complete')}($1, $2, $3::uuid, $4, $5::jsonb, $6, $7) AS completed`,
    // Raises FENCE_LOST_SQLSTATE rather than answer false, so the COMMIT behind it fails.
    completeOrRaise: `${sqlMarker('complete')} SELECT ${fn(t, 'complete_or_raise')}($1, $2, $3::uuid, $4, $5::jsonb, $6, $7) AS completed`,
    ...requestTransactionKeyStatements(t, tableName),
  } as const;
}

/**
 * The functions the claim and the completion call, created by the key table's migration (PL/pgSQL caches their
 * plans per connection, with no prepared statement for PgBouncer to break). The claim decides without a row lock
 * when the answer is plain (a valid lease, a stored response, another fingerprint): replays, 409s and 422s write no
 * WAL. Otherwise it inserts or takes the row over, and reads again (up to three times) a row a concurrent claim
 * changed meanwhile: each statement of a PL/pgSQL function sees rows committed before it started.
 */
export function keyStoreFunctions(tableName: string, dialect: FunctionDialect = 'postgres'): string[] {
  return [claimFunction(tableName, dialect), ...completionFunctions(tableName, dialect)];
}

/**
 * The claim's state when, sent alone at REPEATABLE READ or SERIALIZABLE, it would write under an older snapshot:
 * nothing written, the store sends it again inside `BEGIN ISOLATION LEVEL READ COMMITTED`.
 */
export const READ_COMMITTED_NEEDED = 'read_committed_needed';

/**
 * Before the plain table's claim sent alone (null lock timeout) writes: only READ COMMITTED may (an older snapshot
 * would miss a claim committed meanwhile). claim_in_transaction writes at the work's level.
 */
const READ_COMMITTED_ONLY = `IF p_lock_timeout_ms IS NULL
            AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
           RETURN QUERY SELECT '${READ_COMMITTED_NEEDED}'::text, NULL::integer, NULL::text, NULL::integer, NULL::integer,
             NULL::jsonb, NULL::bytea, NULL::text, NULL::text;
           RETURN;
         END IF;`;

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

/** The completion functions, the same on the plain and the partitioned table. */
export function completionFunctions(tableName: string, dialect: FunctionDialect = 'postgres'): string[] {
  const t = quoteTableName(tableName);
  const { declare, guard, attributes } = dialectParts(dialect, tableName);
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
    ...requestTransactionKeyFunctions(tableName, dialect),
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
