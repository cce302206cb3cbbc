import type { ClaimRequest } from '../../core/idempotency-store.js';
import type { SourceQueryRunner } from '../connection.js';
import type { AttemptParts } from './attempt-parts.js';
import { isUnavailableError } from './unavailable.js';

/** Why a connection is dropped rather than lent again: it may still hold the key's lock (see `ClaimKeeper`). */
export const MAY_HOLD_KEY = Object.assign(new Error("The connection may still hold an idempotency key's lock."), {
  mayHoldKey: true,
});

/**
 * The connection died before the work's deferred BEGIN opened its transaction:
 * nothing of the work committed, but the work had started and may have used
 * its claim's generation (in a downstream key), so the claim is not deleted.
 * Its lease ends now, fenced, and the row keeps the key's history: a retry
 * takes it over at once, with the same generation.
 */
export async function endLease(parts: AttemptParts, request: ClaimRequest): Promise<void> {
  const statement = { text: parts.statements.sql.endLease, values: [request.tenant, request.ownerToken] };
  await parts.pools.run(statement, { write: true }).catch(() => undefined);
}

/**
 * Rolls back whatever `runner` has open, and gives its connection back;
 * never throws. After `failure` that says the connection is gone, nothing
 * is sent on it (a dead pg client can queue a ROLLBACK for ever) and the
 * pool is told to drop it rather than hand it to the next caller; the same
 * after `MAY_HOLD_KEY` (its server process ends, and every lock with it).
 */
export async function endAndRelease(runner: SourceQueryRunner, failure?: unknown): Promise<void> {
  if (failure !== undefined && (failure === MAY_HOLD_KEY || isUnavailableError(failure))) {
    if (runner.isReleased) return;
    // TypeORM's own path for a connection that errored: passes the error on to the pool, which destroys the client.
    const release = (runner as unknown as { releasePostgresConnection?: (error: unknown) => Promise<void> })
      .releasePostgresConnection;
    await (release ? release.call(runner, failure) : runner.release()).catch(() => undefined);
    return;
  }
  try {
    if (runner.isTransactionActive && !runner.isReleased) await runner.rollbackTransaction();
  } catch {
    // A connection that died takes its transaction with it.
  } finally {
    if (!runner.isReleased) await runner.release().catch(() => undefined);
  }
}
