import type { EntityManager } from 'typeorm';
import type { SourceQueryRunner } from '../connection.js';
import { asWorkManager } from '../work-manager.js';
import type { ClaimRequest, OpenAttempt } from '../../core/idempotency-store.js';
import type { ClaimRouting } from './claim-routing.js';
import type { ClaimKeeper } from './request-transaction.js';
import type { DeferredBegin } from './deferred-begin.js';
import type { PipelinedResult } from './pipelined.js';
import type { SeparateClaim } from './separate-claim.js';
import { exchange } from './exchange.js';
import type { Pools } from './pools.js';
import { isFenceLost, type KeyStatements } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { ADMIN_SHUTDOWN, isUnavailableError } from './unavailable.js';

/** What an open attempt uses of its store. */
export interface AttemptParts {
  pools: Pools;
  statements: KeyStatements;
  routing: ClaimRouting;
  /** Owner tokens of open attempts whose transaction holds the key's lock (see `KeyStatements.holdKeyLock`). */
  keyLockHolders: Set<string>;
  /** How a claim committed on its own is sent. */
  separateClaim: SeparateClaim;
}

/** How an attempt was begun (see `openAttempt`). */
export interface AttemptShape {
  /** A request-transaction claim: how it keeps its claim (see `ClaimKeeper`, request-transaction.ts). */
  keeper?: ClaimKeeper;
  /** The claim wrote no row (`claim_in_transaction`): the completion writes it. */
  writesRow?: boolean;
  /** The transaction holds the key's lock (see `KeyStatements.holdKeyLock`): its lease needs no renewal. */
  holdsKeyLock?: boolean;
  /** The transaction's BEGIN waits for the work's first statement; the completion's message takes it when none came. */
  deferredBegin?: DeferredBegin;
}

/** Why a connection is dropped rather than lent again: it may still hold the key's lock (see `ClaimKeeper`). */
export const MAY_HOLD_KEY = Object.assign(new Error("The connection may still hold an idempotency key's lock."), {
  mayHoldKey: true,
});

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

/**
 * The connection died before the work's deferred BEGIN opened its transaction:
 * nothing of the work committed, but the work had started and may have used
 * its claim's generation (in a downstream key), so the claim is not deleted.
 * Its lease ends now, fenced, and the row keeps the key's history: a retry
 * takes it over at once, with the same generation.
 */
async function endLease(parts: AttemptParts, request: ClaimRequest): Promise<void> {
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
