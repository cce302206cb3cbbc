import type { EntityManager } from 'typeorm';
import type { BeginResult, ClaimRequest } from '../../core/idempotency-store.js';
import { openAttempt } from './attempt.js';
import { endAndRelease } from './end-and-release.js';
import { giveBackClaim } from './begin-failed.js';
import { notRun, type SeparateBegin } from './begin-after-claim-pool.js';
import type { PipelinedResult } from './pipeline-types.js';
import { exchange } from './exchange.js';
import { claimResult } from './claim-statements.js';
import type { ClaimRow } from './claim-row.js';
import { BEGIN_READ_COMMITTED, lockTaken } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { isUnavailableError } from './unavailable.js';

/**
 * A separate claim whose work runs under REPEATABLE READ or SERIALIZABLE: the claim, its COMMIT, the work's BEGIN
 * and the key's lock in that transaction (see `KeyStatements.holdKeyLock`), in one round trip.
 */
export async function beginHoldingKeyLock(begin: SeparateBegin, request: ClaimRequest): Promise<BeginResult<EntityManager>> {
  const { pools, statements, routing } = begin.parts;
  const runner = pools.main.createQueryRunner();
  const claimStatement = statements.claims.claim(request, 'claim', null);
  let results: PipelinedResult[] = [];
  try {
    await withTransactionStatementReplaced(runner, 'START TRANSACTION', async (client, startTransaction) => {
      const sent = [
        { text: BEGIN_READ_COMMITTED },
        claimStatement,
        { text: 'COMMIT' },
        { text: startTransaction },
        statements.holdKeyLock(request),
      ];
      results = await exchange(client, sent, pools.main, runner);
      // The connection is gone: whatever else answered, nothing can go on on it.
      const lost = results.find((result) => !result.ok && isUnavailableError(result.error));
      if (lost) throw (lost as { error: unknown }).error;
      // TypeORM must not count a transaction that did not open.
      const opened = results[3];
      if (!opened.ok) throw opened.error;
    });
  } catch (error) {
    // The claim may have committed before the BEGIN failed or the connection was lost.
    return giveBackClaim(begin.store, runner, request, error);
  }
  const [claimed, committed] = [results[1], results[2]];
  if (!claimed.ok || !committed.ok) {
    await endAndRelease(runner);
    throw claimed.ok ? (committed as { error: unknown }).error : claimed.error;
  }
  const claim = claimResult(claimed.rows[0] as ClaimRow | undefined, request);
  routing.noteClaim(claim);
  if (claim.state !== 'claimed') {
    // Nothing to do in the transaction just opened: the answer need not wait for its ROLLBACK.
    void endAndRelease(runner);
    return { claim };
  }
  if (!lockTaken(results[4])) return notRun(begin, runner, request);
  return { claim, attempt: openAttempt(begin.parts, runner, request, { holdsKeyLock: true }) };
}
