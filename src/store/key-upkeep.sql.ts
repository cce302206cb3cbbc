import { sqlMarker } from './sql-marker.js';

/**
 * The key table's statements that no request for a new key sends: the
 * heartbeat, phases, releases, the board's end of a lease, and the sweeper's.
 * Every one is fenced or bounded as its comment says. `recordPhase` is fenced
 * by the owner token inside the work's transaction; `release` gives a claim
 * back without losing a takeover's history; `sweepBatch` deletes expired
 * rows, never one whose lease is valid.
 *
 * Parameters: renewLease ($1-$3 tenant, key, owner token, $4 lease ms);
 * recordPhase ($1-$3, $4 recovery point, $5 results, $6 lease ms); release
 * and forget ($1-$3); endLease ($1 tenant, $2 owner token); sweepBatch ($1
 * batch size, $2 the `last` expiry of the run's previous batch,
 * `'-infinity'` for the first); countExpired ($1 limit).
 *
 * @param t the table name, already quoted (`quoteTableName`)
 */
export function keyUpkeepStatements(t: string) {
  return {
    // The heartbeat of a long handler: fenced like the completion.
    renewLease: `${sqlMarker('renew-lease')}
      UPDATE ${t} SET lease_expires_at = clock_timestamp() + interval '1 millisecond' * $4::float8
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
    // Gives a claim back. A fresh claim (its first attempt, no phase recorded) has nothing to keep: its row goes, and
    // a retry runs at once, even with another body. A takeover's row carries the key's history (the generation its
    // predecessors' downstream calls used, their attempts, their recovery points): it stays, with its lease ended
    // and a new owner token (fencing the attempt), so the next retry takes it over at once and resumes it.
    release: `${sqlMarker('release')}
      WITH gone AS (
        DELETE FROM ${t}
         WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'
           AND attempt = 1 AND recovery_point IS NULL
        RETURNING 1
      ), ended AS (
        UPDATE ${t} SET lease_expires_at = now(), owner_token = gen_random_uuid()
         WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'
           AND NOT (attempt = 1 AND recovery_point IS NULL)
        RETURNING 1
      )
      SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM ended) AS released`,
    // A claim deleted whatever it carries: a poison message dead-lettered (a redrive is a new use of its key).
    forget: `${sqlMarker('release')}
      DELETE FROM ${t} WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND status = 'in_flight'`,
    // An operator's release (the board): the attempt holding owner token $2 loses its lease now and is fenced
    // by a new token, as by a takeover, so the next claim takes the key over (its attempt counted) and the
    // attempt, if it still runs, loses its heartbeat and its completion. Answers the key.
    endLease: `${sqlMarker('end-lease')}
      UPDATE ${t} SET lease_expires_at = now(), owner_token = gen_random_uuid()
       WHERE tenant_id = $1 AND owner_token = $2::uuid AND status = 'in_flight'
       RETURNING key`,
    // Finds expired rows along the expiry_floor index (no row expires before
    // its floor: see EXPIRY_FLOOR_SLACK) and deletes those past their exact
    // expiry, never one whose lease is valid: the rows an index on expires_at
    // would give, without an index the completion has to update. Locks the
    // batch with SKIP LOCKED so a claim racing on one of these keys is never
    // waited on, and re-checks expiry on the locked row version.
    // Each batch starts along the index where the previous one ended ($2,
    // the latest floor it deleted, as ISO 8601 text in UTC: exact to the
    // microsecond, whatever the session's DateStyle): the entries of the rows
    // already deleted stay in the index until VACUUM, and a scan from the
    // start would walk all of them again, every batch (a sweep of millions of
    // rows slowing as it went). What a batch skipped (a valid lease, a row
    // locked by a claim, a row whose handler finished after its floor passed)
    // waits for the next run, which starts from the beginning.
    sweepBatch: `${sqlMarker('sweep-batch')}
      WITH doomed AS (
        SELECT tenant_id, key FROM ${t}
         WHERE expiry_floor <= now() AND expiry_floor >= $2::timestamptz
           AND expires_at <= now() AND NOT (status = 'in_flight' AND lease_expires_at > now())
         ORDER BY expiry_floor
         LIMIT $1
         FOR UPDATE SKIP LOCKED
      ), gone AS (
        DELETE FROM ${t} AS k USING doomed
         WHERE k.tenant_id = doomed.tenant_id AND k.key = doomed.key
           AND k.expires_at <= now() AND NOT (k.status = 'in_flight' AND k.lease_expires_at > now())
        RETURNING k.expiry_floor
      )
      SELECT count(*)::integer AS deleted,
             to_char(max(expiry_floor) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS last
        FROM gone`,
    // The sweeper's backlog for health checks: the rows sweepBatch would delete, counted up to $1 along
    // the expiry_floor index, so a huge backlog costs no more than the limit.
    countExpired: `${sqlMarker('count-expired')}
      SELECT count(*)::integer AS expired FROM (
        SELECT 1 FROM ${t}
         WHERE expiry_floor <= now() AND expires_at <= now() AND NOT (status = 'in_flight' AND lease_expires_at > now())
         LIMIT $1) AS backlog`,
  } as const;
}
