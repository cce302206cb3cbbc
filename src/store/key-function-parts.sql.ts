/** What every function of the key table shares, whichever file writes it. */
type KeyStoreFunction = 'claim' | 'complete' | 'complete_or_raise' | 'claim_in_transaction' | 'complete_in_transaction';

/** A function of the key table, named after it and in its schema: `"billing"."payment_keys_claim"`. */
export function keyStoreFunction(quotedTable: string, name: KeyStoreFunction): string {
  return `${quotedTable.slice(0, -1)}_${name}"`;
}

/** SQLSTATE `complete_or_raise` raises when the key is no longer this attempt's: an error, so the COMMIT behind it fails. */
export const FENCE_LOST_SQLSTATE = 'NI409';

/** The parameters and result columns of every claim function: the store calls them alike and reads them the same way. */
export const CLAIM_FUNCTION_SIGNATURE = `(
       p_tenant text, p_key text, p_fingerprint text, p_owner uuid, p_lease_ms float8, p_ttl_ms float8, p_lock_timeout_ms float8)
     RETURNS TABLE (state text, attempt integer, generation text, retry_after integer, response_status integer,
                    response_headers jsonb, response_body bytea, recovery_point text, phase_results text)`;

/** Marks the claim functions of this version (a comment in their source): the start-up check refuses older ones. */
export const KEY_FUNCTIONS_VERSION = 'nest-idempotency-pg key functions 5';

/**
 * How long after `greatest(expiry_floor, lease_expires_at)` a completed row may still expire: a later completion
 * moves the floor, so the sweeper can read the floor's index, which a completion leaves alone (HOT updates); see
 * docs/design.md, the key table's indexes.
 */
export const EXPIRY_FLOOR_SLACK = "interval '1 minute'";

/**
 * The key's advisory lock: chained hashes (no two pairs join into one string), seeded with the table so two key
 * tables never wait on each other. A collision only makes two keys wait for each other.
 */
export function keyLock(tableName: string, tenant = 'p_tenant', key = 'p_key'): string {
  const seed = `nest-idempotency:key:${tableName}`.replace(/'/g, "''");
  return `hashtextextended(${key}, hashtextextended(${tenant}, hashtextextended('${seed}', 0)))`;
}

/** The claim's answer when another attempt holds the key's lock: in flight, for about a lease (its own is unknown). */
export const HELD_ELSEWHERE = `RETURN QUERY SELECT 'in_flight'::text, NULL::integer, NULL::text,
             greatest(1, ceil(p_lease_ms / 1000))::integer, NULL::integer, NULL::jsonb, NULL::bytea, NULL::text, NULL::text;`;
