/**
 * What every function of the key table shares, whichever file writes it (key-store.sql.ts,
 * request-transaction-key.sql.ts, the partitioned table's): its name, the claim's signature and version mark,
 * the key's lock, the fence's SQLSTATE and the expiry floor's slack.
 */

type KeyStoreFunction = 'claim' | 'complete' | 'complete_or_raise' | 'claim_in_transaction' | 'complete_in_transaction';

/** A function of the key table, named after it and in its schema: `"billing"."payment_keys_claim"`. */
export function keyStoreFunction(quotedTable: string, name: KeyStoreFunction): string {
  return `${quotedTable.slice(0, -1)}_${name}"`;
}

/**
 * SQLSTATE the completion raises when its fence fails (`complete_or_raise`):
 * the key is no longer this attempt's. An error, not a false result, so that a
 * COMMIT sent in the same message never runs after it.
 */
export const FENCE_LOST_SQLSTATE = 'NI409';

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
