import type { EntityManager } from 'typeorm';
import type { SourceQueryRunner } from '../connection.js';
import { asWorkManager } from '../work-manager.js';
import type { ClaimRequest, OpenAttempt } from '../../core/idempotency-store.js';
import type { AttemptParts, AttemptShape } from './attempt-parts.js';
import { endAndRelease, endLease, MAY_HOLD_KEY } from './end-and-release.js';
import type { PipelinedResult } from './pipelined.js';
import { exchange } from './exchange.js';
import { isFenceLost } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { ADMIN_SHUTDOWN, isUnavailableError } from './unavailable.js';

/**
 * The end of an attempt begun on `runner`, whose transaction is open: the
 * completion and the COMMIT in one round trip, a rollback that can keep the
 * claim, and an abort from outside.
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
  let ended = false;
  /** The completion is on its way: too late to abort. */
  let committing = false;
  let aborted = false;
  const openedAt = routing.attemptOpened();
  const recordEnd = () => {
    keyLockHolders.delete(request.ownerToken);
    routing.attemptEnded(openedAt);
  };
  const end = async (failure?: unknown) => {
    ended = true;
    recordEnd();
    await endAndRelease(runner, failure);
  };
  return {
    tx: asWorkManager(runner.manager),
    holdsKeyLock,
    commit: async (response, ttlMs) => {
      if (aborted) return false;
      if (ended) throw new Error('This attempt has already ended.');
      committing = true;
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
              statements.completion(request, response, ttlMs, writesRow),
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
        ended = true;
        recordEnd();
        await runner.release();
        return true;
      } catch (error) {
        // TypeORM's commitTransaction threw, so its subscribers were told of no commit, and the rollback below tells
        // them of the rollback: sent only when the server still has the transaction (another ROLLBACK would be a
        // round trip and a warning in the server's log).
        if (rolledBack) await withTransactionStatementReplaced(runner, 'ROLLBACK', async () => undefined).catch(() => undefined);
        const letGo = !keeper || isUnavailableError(error) || (await keeper.afterFailedCompletion(runner, answers));
        await end(letGo ? error : MAY_HOLD_KEY);
        if (isFenceLost(error)) return false;
        throw error;
      }
    },
    rollback: async (keepClaim) => {
      if (ended || aborted) return false;
      if (keepClaim && keeper) {
        try {
          if (await keeper.keep(runner)) return true;
        } catch (error) {
          if (isUnavailableError(error)) {
            if (!ended) await end(error);
            throw error;
          }
        }
      }
      ended = true;
      recordEnd();
      let drop: unknown;
      try {
        if (keeper) drop = await keeper.rollback(runner);
        else if (runner.isTransactionActive) await runner.rollbackTransaction();
      } catch (error) {
        if (isUnavailableError(error)) {
          if (how.deferredBegin && !how.deferredBegin.opened) await endLease(parts, request);
          throw error;
        }
        // Whatever else the connection holds of the key cannot be known now: it goes rather than back to the pool.
        if (keeper) drop = MAY_HOLD_KEY;
      } finally {
        if (drop !== undefined) await endAndRelease(runner, drop);
        else if (!runner.isReleased) await runner.release();
      }
      return false;
    },
    abort: async () => {
      if (ended || committing || aborted) return;
      aborted = true;
      // The work may be anywhere: waiting on another system (its connection idle in the transaction) or inside a
      // statement of its own. Ending its server process ends both, rolls the transaction back and frees the key's
      // lock; the work's next statement fails, and its connection is dropped rather than lent again.
      const pid = (runner as unknown as { databaseConnection?: { processID?: number } }).databaseConnection?.processID;
      if (pid !== undefined) {
        // `::integer` on Citus: it adds pg_terminate_backend(bigint, bigint), and an untyped parameter then fails
        // (42725, not unique), so the hung attempt would keep its key. One server gets the text it always got.
        const text = parts.statements.citus ? 'SELECT pg_terminate_backend($1::integer)' : 'SELECT pg_terminate_backend($1)';
        const terminate = { text, values: [pid] };
        await pools.run(terminate, { source: pools.claimPool }).catch(() => undefined);
      }
      await end(Object.assign(new Error('The attempt held its key past maxHold and was ended.'), { code: ADMIN_SHUTDOWN }));
    },
  };
}
