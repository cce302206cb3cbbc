import type { EntityManager } from 'typeorm';
import type { SourceQueryRunner } from '../connection.js';
import { asWorkManager } from '../work-manager.js';
import type { ClaimRequest, OpenAttempt } from '../../core/idempotency-store.js';
import type { AttemptLife, AttemptParts, AttemptShape } from './attempt-parts.js';
import { abortAttempt, commitFailed, rollbackAttempt } from './attempt-rollback.js';
import type { PipelinedResult } from './pipeline-types.js';
import { exchange } from './exchange.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';

/**
 * The end of an attempt begun on `runner`, whose transaction is open: the completion and the COMMIT in one round
 * trip, a rollback that can keep the claim, and an abort from outside.
 */
export function openAttempt(
  parts: AttemptParts,
  runner: SourceQueryRunner,
  request: ClaimRequest,
  how: AttemptShape = {},
): OpenAttempt<EntityManager> {
  const { pools, statements, routing, keyLockHolders } = parts;
  const { keeper, writesRow = false, holdsKeyLock = false } = how;
  if (holdsKeyLock) keyLockHolders.add(request.ownerToken);
  const openedAt = routing.attemptOpened();
  const life: AttemptLife = {
    parts,
    runner,
    request,
    how,
    ended: false,
    committing: false,
    aborted: false,
    recordEnd: () => {
      keyLockHolders.delete(request.ownerToken);
      routing.attemptEnded(openedAt);
    },
  };
  return {
    tx: asWorkManager(runner.manager),
    holdsKeyLock,
    commit: async (response, ttlMs) => {
      if (life.aborted) return false;
      if (life.ended) throw new Error('This attempt has already ended.');
      life.committing = true;
      /** The COMMIT answered ROLLBACK (the completion before it failed): the transaction has ended on the server. */
      let rolledBack = false;
      let answers: PipelinedResult[] | undefined;
      try {
        await withTransactionStatementReplaced(runner, 'COMMIT', async (client) => {
          const begin = how.deferredBegin?.take();
          const failed = await keeper?.endOfFailedTransaction?.(client);
          const completed = await exchange(
            client,
            [
              ...(begin ? [begin] : []),
              statements.claims.completion(request, response, ttlMs, writesRow),
              ...(failed ?? [{ text: 'COMMIT' }]),
            ],
            pools.main,
            runner,
          );
          answers = begin ? completed.slice(1) : completed;
          const [completion] = answers;
          const last = answers[answers.length - 1];
          rolledBack = !completion.ok && last.ok;
          if (!completion.ok) throw completion.error;
          if (!last.ok) throw last.error;
          if (failed) throw new Error('The completion ran in a failed transaction.');
        });
        life.ended = true;
        life.recordEnd();
        await runner.release();
        return true;
      } catch (error) {
        return commitFailed(life, error, rolledBack, answers);
      }
    },
    rollback: (keepClaim) => rollbackAttempt(life, keepClaim),
    abort: () => abortAttempt(life),
  };
}
