import type { EntityManager } from 'typeorm';
import type { EventEmitter } from 'node:events';
import type { SourceQueryRunner } from '../connection.js';
import type { BeginResult, ClaimRequest } from '../../core/idempotency-store.js';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { messages } from '../../errors/messages.js';
import { openAttempt } from './attempt.js';
import type { AttemptParts } from './attempt-parts.js';
import { endAndRelease, MAY_HOLD_KEY } from './end-and-release.js';
import type { PipelinedResult, PipelinedStatement } from './pipeline-types.js';
import { exchange } from './exchange.js';
import type { PgClient } from './pools.js';
import { claimResult } from './claim-statements.js';
import type { ClaimRow } from './claim-row.js';
import { isFenceLost, SERIALIZATION_FAILURE, sqlState, WORK_SAVEPOINT } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { isUnavailableError } from './unavailable.js';

/**
 * A request-transaction claim whose snapshot predates the key's last commit (REPEATABLE READ, SERIALIZABLE): its
 * write met the row the snapshot missed (a serialization failure), and the transaction starts again.
 */
const STALE_SNAPSHOT = Symbol('stale snapshot');

/** How often `begin` starts a request-transaction attempt again for a stale snapshot, at least, before answering 409. */
const STALE_SNAPSHOT_TRIES = 5;

/**
 * What a request-transaction attempt does differently (`openAttempt`'s `keeper`): how it undoes its work while
 * keeping its claim, and what its connection may hold of the key besides its transaction. A separate attempt has
 * none.
 */
export interface ClaimKeeper {
  /** Statements sent after the claim, in the BEGIN's message. */
  readonly afterClaim: readonly PipelinedStatement[];
  /**
   * `rollback(true)`: undoes the work's writes, keeping the claim and the key's lock, with the transaction open.
   * False when it could not (the attempt then ends); throws a lost connection's error.
   */
  keep(runner: SourceQueryRunner): Promise<boolean>;
  /**
   * `rollback(false)`: ends the transaction, and lets go of whatever else of the key the connection holds.
   * Answers a reason to drop the connection rather than lend it again, when it could not.
   */
  rollback(runner: SourceQueryRunner): Promise<unknown>;
  /**
   * What to send after the completion instead of its COMMIT when the work's transaction has already failed (the
   * handler caught its own SQL error and answered), read on the connection: the completion then fails, and these
   * end the transaction, letting go of whatever else of the key the connection holds before it is idle. Undefined
   * when the transaction has not failed.
   */
  endOfFailedTransaction?(client: PgClient): Promise<readonly PipelinedStatement[] | undefined>;
  /**
   * The completion failed and the transaction has ended: lets go of whatever of the key the connection still holds.
   * `answers`: the completion's, then those of what followed it in its message (undefined: none came). False when
   * it could not: the connection is then dropped.
   */
  afterFailedCompletion(runner: SourceQueryRunner, answers: PipelinedResult[] | undefined): Promise<boolean>;
}

/**
 * `PostgresIdempotencyStore.begin` in claim mode `request-transaction`: the
 * BEGIN of the work's transaction and the claim as its first statement, in
 * one round trip; and how the attempt keeps its claim when a failure's answer
 * is stored (see `ClaimKeeper`).
 *
 * On one server's plain table the claim holds the key's lock for its session
 * too, so a stored failure rolls the work back (`ROLLBACK AND CHAIN`) and
 * completes the key in the chained transaction, with no savepoint in the
 * request (`sessionHold`). The partitioned table, whose claim writes its
 * in-flight row in the transaction, and Citus, whose locks are taken on the
 * worker's connections, keep a savepoint after the claim (`savepoint`).
 */
export class RequestTransactionBegin {
  constructor(
    private readonly parts: AttemptParts,
    private readonly table: { name: string; partitioned: boolean },
    /** Whether the work's transactions run at READ COMMITTED (see `ClaimAndBegin.businessReadCommitted`). */
    private readonly businessReadCommitted: () => Promise<boolean>,
  ) {}

  async begin(request: ClaimRequest, lockTimeoutMs: number): Promise<BeginResult<EntityManager>> {
    if (this.table.partitioned && !(await this.businessReadCommitted())) {
      throw new IdempotencyConfigurationError(messages.config.partitionedRequestTransactionIsolation(this.table.name));
    }
    // A stale snapshot means the key's previous holder committed after the transaction began: start again, waiting for
    // the key no longer in all than the caller allows, and a few times at least.
    const deadline = Date.now() + lockTimeoutMs;
    for (let tries = 1; ; tries++) {
      const begun = await this.beginOnce(request, Math.max(0, deadline - Date.now()));
      if (begun !== STALE_SNAPSHOT) return begun;
      if (tries >= STALE_SNAPSHOT_TRIES && Date.now() >= deadline) return { claim: { state: 'in-flight', retryAfterSeconds: 1 } };
    }
  }

  private async beginOnce(
    request: ClaimRequest,
    lockTimeoutMs: number,
  ): Promise<BeginResult<EntityManager> | typeof STALE_SNAPSHOT> {
    const { pools, statements } = this.parts;
    const keeper = statements.holdsKeyForSession ? sessionHold(this.parts, request) : savepoint(this.parts);
    const runner = pools.main.createQueryRunner();
    const claimFunction = statements.inTransactionClaim;
    let results: PipelinedResult[] = [];
    try {
      await withTransactionStatementReplaced(runner, 'START TRANSACTION', async (client, startTransaction) => {
        const sent = [
          { text: startTransaction },
          statements.claims.claim(request, claimFunction, lockTimeoutMs),
          ...keeper.afterClaim,
        ];
        results = await exchange(client, sent, pools.main, runner);
        // The connection is gone: whatever else answered, nothing can go on on it.
        const lost = results.find((result) => !result.ok && isUnavailableError(result.error));
        if (lost) throw (lost as { error: unknown }).error;
        // TypeORM must not count a transaction that did not open.
        if (!results[0].ok) throw results[0].error;
      });
    } catch (error) {
      await endAndRelease(runner, error);
      throw error;
    }
    const claimed = results[1];
    if (!claimed.ok) {
      const stale = sqlState(claimed.error) === SERIALIZATION_FAILURE;
      // A claim that failed otherwise (a statement timeout, a cancel) may have failed after it took the key's lock for
      // its session: the connection goes, rather than back to the pool with it. (A stale snapshot fails before that.)
      await endAndRelease(runner, statements.holdsKeyForSession && !stale ? MAY_HOLD_KEY : undefined);
      if (stale) return STALE_SNAPSHOT;
      throw claimed.error;
    }
    const claim = claimResult(claimed.rows[0] as ClaimRow | undefined, request);
    if (claim.state !== 'claimed') {
      // Nothing to do in the transaction just opened (the claim took no lock for its session): the answer need not
      // wait for its ROLLBACK.
      void endAndRelease(runner);
      return { claim };
    }
    return {
      claim,
      attempt: openAttempt(this.parts, runner, request, { keeper, writesRow: claimFunction === 'claim_in_transaction' }),
    };
  }
}

/**
 * One server's plain table: the claim holds the key's lock for its session as well as its transaction
 * (HOLD_FOR_SESSION in request-transaction-key.sql.ts). The work is undone with `ROLLBACK AND CHAIN`, which keeps
 * the session's hold and opens the transaction the failure's answer is stored in at once; the completion hands the
 * hold back to that transaction. Every other end lets go of it before the connection goes back to the pool, or
 * drops the connection: a hold left on a pooled connection would keep the key locked for as long as that connection
 * lives.
 *
 * No exchange ends outside a transaction while the session holds the key: the connection is never idle with it.
 */
function sessionHold(parts: AttemptParts, request: ClaimRequest): ClaimKeeper {
  const { pools, statements } = parts;
  const release = statements.releaseKeyLock(request);
  const released = (result: PipelinedResult | undefined) =>
    result?.ok === true && (result.rows[0] as { released?: boolean } | undefined)?.released === true;
  /** The work was rolled back and the chained transaction has run nothing: it cannot have failed. */
  let chained = false;
  return {
    afterClaim: [],
    keep: async (runner) => {
      // TypeORM sees the work's transaction roll back (its subscribers, the app's rollback hooks) and the next one open.
      await withTransactionStatementReplaced(runner, 'ROLLBACK', async (client) => {
        const [rolledBack] = await exchange(client, [{ text: 'ROLLBACK AND CHAIN' }], pools.main, runner);
        if (!rolledBack.ok) throw rolledBack.error;
      });
      await withTransactionStatementReplaced(runner, 'START TRANSACTION', async () => undefined);
      chained = true;
      return true;
    },
    rollback: async (runner) => {
      if (!runner.isTransactionActive) {
        const [answer] = await exchange((await runner.connect()) as PgClient, [release], pools.main, runner);
        return released(answer) ? undefined : MAY_HOLD_KEY;
      }
      let answers: PipelinedResult[] = [];
      // Released inside a transaction, so the connection is never idle with the hold. The work's own transaction may
      // have been aborted (the handler's SQL error), where nothing but a rollback runs: chained first.
      const sent = chained ? [release, { text: 'ROLLBACK' }] : [{ text: 'ROLLBACK AND CHAIN' }, release, { text: 'ROLLBACK' }];
      await withTransactionStatementReplaced(runner, 'ROLLBACK', async (client) => {
        answers = await exchange(client, sent, pools.main, runner);
        const lost = answers.find((answer) => !answer.ok && isUnavailableError(answer.error));
        if (lost) throw (lost as { error: unknown }).error;
      });
      return released(answers[sent.indexOf(release)]) && answers[sent.length - 1].ok ? undefined : MAY_HOLD_KEY;
    },
    // The completion cannot run there, so it cannot take the hold over: released in the same message instead.
    endOfFailedTransaction: async (client) =>
      (await transactionStatus(client)) === 'E' ? [{ text: 'ROLLBACK AND CHAIN' }, release, { text: 'ROLLBACK' }] : undefined,
    afterFailedCompletion: async (runner, answers) => {
      // Never answered: what it did cannot be known.
      if (answers === undefined) return false;
      const [completion, ...after] = answers;
      // The completion hands the hold to its transaction before anything in it can fail but the fence at its end.
      if (completion.ok || isFenceLost(completion.error)) return true;
      // Sent after a failed transaction's completion (endOfFailedTransaction).
      if (after.length > 1) return released(after[1]) && after[2].ok;
      // It never ran: the session still holds the key.
      const [answer] = await exchange((await runner.connect()) as PgClient, [release], pools.main, runner).catch(() => []);
      return released(answer);
    },
  };
}

/**
 * The connection's transaction status (`I` idle, `T` in a transaction, `E` in a failed one), as of the answer to
 * its last statement. A failed statement's error reaches the caller before the ReadyForQuery that carries the
 * status: that is waited for (or for the connection's end), as node-postgres itself waits before sending more.
 */
async function transactionStatus(client: PgClient): Promise<string | null | undefined> {
  // node-postgres 8's client: whether the last ReadyForQuery has come, and the connection that emits it.
  const { readyForQuery, connection } = client as unknown as { readyForQuery?: boolean; connection?: EventEmitter };
  if (readyForQuery === false && connection) {
    await new Promise<void>((resolve) => {
      const events = ['readyForQuery', 'end', 'error'];
      const settle = () => {
        for (const event of events) connection.removeListener(event, settle);
        resolve();
      };
      for (const event of events) connection.once(event, settle);
    });
  }
  return client.getTransactionStatus?.();
}

/**
 * The partitioned table and Citus: a savepoint right after the claim. Undoing the work back to it keeps the
 * claim, its in-flight row (the partitioned table's) and the transaction's lock of the key.
 */
function savepoint(parts: AttemptParts): ClaimKeeper {
  const { pools } = parts;
  return {
    afterClaim: [{ text: `SAVEPOINT ${WORK_SAVEPOINT}` }],
    keep: async (runner: SourceQueryRunner) => {
      const client = (await runner.connect()) as PgClient;
      const [undone] = await exchange(client, [{ text: `ROLLBACK TO SAVEPOINT ${WORK_SAVEPOINT}` }], pools.main, runner);
      if (undone.ok) return true;
      if (isUnavailableError(undone.error)) throw undone.error;
      return false;
    },
    rollback: async (runner) => {
      if (runner.isTransactionActive) await runner.rollbackTransaction();
      return undefined;
    },
    afterFailedCompletion: async () => true,
  };
}
