import { sqlMarker } from './redacting-logger.js';

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
 * statement, committed on its own; `complete` and `recordPhase` are fenced by
 * the owner token inside the work's transaction; `release` gives a claim
 * back; `sweepBatch` deletes expired rows, never one whose lease is valid.
 *
 * Parameters: claim ($1 tenant, $2 key, $3 fingerprint, $4 owner token,
 * $5 lease ms, $6 ttl ms); complete ($1-$3 tenant, key, owner token, $4 status,
 * $5 headers, $6 body, $7 ttl ms); recordPhase ($1-$3, $4 recovery point,
 * $5 results, $6 lease ms); release ($1-$3); sweepBatch ($1 batch size).
 *
 * @param t the table name, already quoted (`quoteTableName`)
 */
export function keyStoreStatements(t: string) {
  return {
    // One statement answers every cell of the state table. `existing` reads
    // the row on the statement's snapshot. When that row is plainly not
    // claimable (a valid lease, a stored response, another fingerprint) the
    // INSERT is skipped, so replays, 409s and 422s take no row lock and write
    // no WAL. Otherwise the INSERT takes the key when it is absent, expired,
    // or in flight with a lapsed lease and the same fingerprint, re-checking
    // on the locked, latest row version. The snapshot can predate a row that a
    // concurrent claim committed while this one waited on its lock: such
    // rows come back as 'retry' (or not at all) and the claim runs again.
    claim: `${sqlMarker('claim')}
      WITH existing AS (
        SELECT * FROM ${t} WHERE tenant_id = $1 AND key = $2
      ),
      claimed AS (
        INSERT INTO ${t} AS k
          (tenant_id, key, fingerprint, status, owner_token, generation, attempt, lease_expires_at, expires_at, created_at)
        SELECT $1::text, $2::text, $3::text, 'in_flight', $4::uuid, $4::uuid, 1,
               now() + interval '1 millisecond' * $5::float8,
               now() + interval '1 millisecond' * $6::float8, now()
         WHERE NOT EXISTS (
           SELECT 1 FROM existing x
            WHERE (x.status = 'in_flight' AND x.lease_expires_at > now())
               OR (x.expires_at > now() AND (x.status = 'completed' OR x.fingerprint <> $3::text)))
        ON CONFLICT (tenant_id, key) DO UPDATE SET
          fingerprint = EXCLUDED.fingerprint,
          status = 'in_flight',
          owner_token = EXCLUDED.owner_token,
          attempt = CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempt + 1 END,
          -- Downstream keys derive from the generation: the same for a takeover (it finishes the same
          -- work), new for a key reused after it expired (new work).
          generation = CASE WHEN k.expires_at <= now() THEN EXCLUDED.generation ELSE COALESCE(k.generation, EXCLUDED.generation) END,
          lease_expires_at = EXCLUDED.lease_expires_at,
          expires_at = EXCLUDED.expires_at,
          created_at = now(),
          completed_at = NULL,
          response_status = NULL,
          response_headers = NULL,
          response_body = NULL,
          -- A takeover resumes the phases its predecessor recorded; a fresh claim of an expired key starts over.
          recovery_point = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.recovery_point END,
          phase_results = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.phase_results END
        WHERE NOT (k.status = 'in_flight' AND k.lease_expires_at > now())
          AND (k.expires_at <= now() OR (k.status = 'in_flight' AND k.fingerprint = EXCLUDED.fingerprint))
        RETURNING k.attempt, k.generation, k.recovery_point, k.phase_results
      )
      SELECT 'claimed' AS state, attempt, generation::text AS generation, NULL::int AS retry_after,
             NULL::int AS response_status, NULL::jsonb AS response_headers, NULL::bytea AS response_body,
             recovery_point, phase_results
        FROM claimed
      UNION ALL
      SELECT CASE
               WHEN e.status = 'in_flight' AND e.lease_expires_at > now()
                 THEN CASE WHEN e.fingerprint = $3 THEN 'in_flight' ELSE 'mismatch' END
               WHEN e.expires_at <= now() THEN 'retry'
               WHEN e.fingerprint <> $3 THEN 'mismatch'
               WHEN e.status = 'completed' THEN 'completed'
               ELSE 'retry'
             END,
             e.attempt,
             NULL::text,
             GREATEST(1, CEIL(EXTRACT(EPOCH FROM (e.lease_expires_at - now()))))::int,
             e.response_status,
             CASE WHEN e.fingerprint = $3 AND e.status = 'completed' THEN e.response_headers END,
             CASE WHEN e.fingerprint = $3 AND e.status = 'completed' THEN e.response_body END,
             NULL, NULL
        FROM existing e
       WHERE NOT EXISTS (SELECT 1 FROM claimed)`,
    complete: `${sqlMarker('complete')}
      UPDATE ${t}
         SET status = 'completed', response_status = $4, response_headers = $5::jsonb, response_body = $6,
             completed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 millisecond' * $7::float8
       WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'`,
    // Fenced like the completion; also renews the lease, so a handler that keeps
    // making progress keeps its key. Both run inside the work's transaction,
    // whose now() is when it began: the clock counts from the write instead.
    // (Still the database's clock: every lease and TTL comparison uses it.)
    recordPhase: `${sqlMarker('record-phase')}
      UPDATE ${t}
         SET recovery_point = $4, phase_results = $5,
             lease_expires_at = clock_timestamp() + interval '1 millisecond' * $6::float8
       WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'`,
    release: `${sqlMarker('release')}
      DELETE FROM ${t} WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'`,
    // Locks the batch with SKIP LOCKED so a claim racing on one of these keys
    // is never waited on, and re-checks expiry on the locked row version.
    sweepBatch: `${sqlMarker('sweep-batch')}
      WITH doomed AS (
        SELECT tenant_id, key FROM ${t}
         WHERE expires_at <= now() AND NOT (status = 'in_flight' AND lease_expires_at > now())
         LIMIT $1
         FOR UPDATE SKIP LOCKED
      )
      DELETE FROM ${t} AS k USING doomed
       WHERE k.tenant_id = doomed.tenant_id AND k.key = doomed.key
         AND k.expires_at <= now() AND NOT (k.status = 'in_flight' AND k.lease_expires_at > now())`,
  } as const;
}
