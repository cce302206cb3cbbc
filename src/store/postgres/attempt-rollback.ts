import { endAndRelease, endLease, MAY_HOLD_KEY } from './end-and-release.js';
import type { AttemptLife } from './attempt-parts.js';
import type { PipelinedResult } from './pipeline-types.js';
import { isFenceLost } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { ADMIN_SHUTDOWN, isUnavailableError } from './unavailable.js';

/** Ends the attempt and gives its connection back, dropped after `failure` (see `endAndRelease`). */
async function endAttempt(life: AttemptLife, failure?: unknown): Promise<void> {
  life.ended = true;
  life.recordEnd();
  await endAndRelease(life.runner, failure);
}

/** An open attempt's completion or COMMIT failed (see `openAttempt`): false when the key was no longer its. */
export async function commitFailed(
  life: AttemptLife,
  error: unknown,
  rolledBack: boolean,
  answers: PipelinedResult[] | undefined,
): Promise<boolean> {
  const { runner, how } = life;
  const { keeper } = how;
  // TypeORM's commitTransaction threw, so its subscribers were told of no commit, and the rollback below tells
  // them of the rollback: sent only when the server still has the transaction (another ROLLBACK would be a
  // round trip and a warning in the server's log).
  if (rolledBack) await withTransactionStatementReplaced(runner, 'ROLLBACK', async () => undefined).catch(() => undefined);
  const letGo = !keeper || isUnavailableError(error) || (await keeper.afterFailedCompletion(runner, answers));
  await endAttempt(life, letGo ? error : MAY_HOLD_KEY);
  if (isFenceLost(error)) return false;
  throw error;
}

/** An open attempt's rollback (see `openAttempt`): a request-transaction attempt may keep its claim. */
export async function rollbackAttempt(life: AttemptLife, keepClaim: boolean): Promise<boolean> {
  const { parts, runner, request, how } = life;
  const { keeper } = how;
  if (life.ended || life.aborted) return false;
  if (keepClaim && keeper) {
    try {
      if (await keeper.keep(runner)) return true;
    } catch (error) {
      if (isUnavailableError(error)) {
        if (!life.ended) await endAttempt(life, error);
        throw error;
      }
    }
  }
  life.ended = true;
  life.recordEnd();
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
}

/** Ends an open attempt from outside (its key held past `maxHold`), unless its completion is on its way. */
export async function abortAttempt(life: AttemptLife): Promise<void> {
  const { parts, runner } = life;
  const { pools } = parts;
  if (life.ended || life.committing || life.aborted) return;
  life.aborted = true;
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
  await endAttempt(
    life,
    Object.assign(new Error('The attempt held its key past maxHold and was ended.'), { code: ADMIN_SHUTDOWN }),
  );
}
