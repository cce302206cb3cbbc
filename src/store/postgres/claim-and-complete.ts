import type { EntityManager } from 'typeorm';
import type { ClaimRef, ClaimRequest, ClaimResult, StoredResponse } from '../../core/idempotency-store.js';
import type { AttemptParts } from './attempt-parts.js';
import { claimResult } from './claim-statements.js';
import type { ClaimRow } from './claim-row.js';
import { answerOf, lendConnection } from './pools.js';
import { isFenceLost } from './statements.js';
import { isUnavailableError } from './unavailable.js';

/** The store's `claim` (see `PostgresIdempotencyStore.claim`); a new key's claim goes with `begin` instead. */
export async function claim(
  parts: AttemptParts,
  request: ClaimRequest,
  tx?: EntityManager,
  lockTimeoutMs?: number,
): Promise<ClaimResult> {
  if (!tx) return claimResult((await claimAlone(parts, request))[0], request);
  const statement = parts.statements.claims.claim(request, parts.statements.inTransactionClaim, lockTimeoutMs ?? 0);
  const { rows } = await parts.pools.run(statement, { tx });
  return claimResult(rows[0] as ClaimRow | undefined, request);
}

/** A claim committed on its own, on the claim pool, in one round trip (see `SeparateClaim`). */
async function claimAlone({ pools, separateClaim }: AttemptParts, request: ClaimRequest): Promise<ClaimRow[]> {
  const { claimPool } = pools;
  const [client, release] = await lendConnection(claimPool);
  let failure: unknown;
  try {
    const { claimed, committed } = await separateClaim.send(client, request, claimPool);
    const { rows } = answerOf(claimed);
    answerOf(committed);
    return rows as ClaimRow[];
  } catch (error) {
    failure = error;
    throw error;
  } finally {
    // A failed claim's COMMIT answered ROLLBACK: the connection is idle again, unless it died.
    release(failure !== undefined && isUnavailableError(failure) ? failure : undefined);
  }
}

/** The store's fenced `complete`; a new key's completion goes with its attempt's COMMIT instead (attempt.ts). */
export async function complete(
  { pools, statements }: AttemptParts,
  ref: ClaimRef,
  response: StoredResponse,
  ttlMs: number,
  tx?: EntityManager,
): Promise<boolean> {
  try {
    const { rows } = await pools.run(statements.complete(ref, response, ttlMs), tx ? { tx } : { write: true });
    return (rows as Array<{ completed: boolean }>)[0]?.completed === true;
  } catch (error) {
    if (isFenceLost(error)) return false;
    throw error;
  }
}
