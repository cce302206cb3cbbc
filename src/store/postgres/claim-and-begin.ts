import type { EntityManager } from 'typeorm';
import type { SourceQueryRunner } from '../connection.js';
import type { BeginResult, ClaimRequest } from '../../core/idempotency-store.js';
import { openAttempt } from './attempt.js';
import type { AttemptParts, KeyCalls } from './attempt-parts.js';
import { claimFailed, giveBackClaim } from './begin-failed.js';
import { startAtOnce } from './deferred-begin-alone.js';
import type { PipelinedResult } from './pipeline-types.js';
import { DeferredBegin } from './deferred-begin.js';
import type { PgClient } from './pools.js';
import { queryClassOf } from './node-postgres-query.js';
import { beginAfterClaimPool } from './begin-after-claim-pool.js';
import { readsCommitted } from './business-isolation.js';
import { beginHoldingKeyLock } from './begin-holding-key-lock.js';
import { claimResult } from './claim-statements.js';
import type { ClaimRow } from './claim-row.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { isUnavailableError } from './unavailable.js';

/**
 * The store's `begin` in claim mode `separate` (`request-transaction`: `RequestTransactionBegin`): the claim and the
 * work's BEGIN in one round trip, on the connection the work then uses. The claim commits on its own, durably, at READ
 * COMMITTED (a concurrent claim's commit is read, never a serialization failure): the work may use its generation
 * before its COMMIT, and a retry after a crash must find it. The work's BEGIN goes out with its first statement.
 */
export class ClaimAndBegin {
  private readCommitted?: Promise<boolean>;

  constructor(
    readonly store: KeyCalls,
    readonly parts: AttemptParts,
  ) {}

  /** Whether the work's transactions run at READ COMMITTED (see `readsCommitted`), read once. */
  businessReadCommitted(): Promise<boolean> {
    this.readCommitted ??= readsCommitted(this.parts.pools).catch((error: unknown) => {
      this.readCommitted = undefined;
      throw error;
    });
    return this.readCommitted;
  }

  /** A separate claim: see `beginSeparate` (READ COMMITTED work), else `beginHoldingKeyLock`. */
  async begin(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    if (await this.businessReadCommitted()) return this.beginSeparate(request);
    return this.parts.routing.claimPoolFirst() ? beginAfterClaimPool(this, request) : beginHoldingKeyLock(this, request);
  }

  /**
   * A separate claim whose work runs at READ COMMITTED, committed on its own (`SeparateClaim`) on the connection the
   * work then uses; the work's BEGIN goes out with its first statement (`DeferredBegin`), so a replay, a 409 or a 422
   * opens no transaction. No room on the main pool: the claim pool (claim-routing.ts).
   */
  private async beginSeparate(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    const { pools, separateClaim, routing } = this.parts;
    if (!routing.mainPoolHasRoom()) return beginAfterClaimPool(this, request);
    const runner = pools.main.createQueryRunner();
    let claimed: PipelinedResult;
    let committed: PipelinedResult;
    let client: PgClient;
    try {
      client = (await runner.connect()) as PgClient;
      ({ claimed, committed } = await separateClaim.send(client, request, pools.main, runner));
      // The connection is gone: whether the claim committed is unknown.
      const lost = [claimed, committed].find((result) => !result.ok && isUnavailableError(result.error));
      if (lost) throw (lost as { error: unknown }).error;
    } catch (error) {
      return giveBackClaim(this.store, runner, request, error);
    }
    if (!claimed.ok || !committed.ok) return claimFailed(runner, claimed, committed);
    const claim = claimResult(claimed.rows[0] as ClaimRow | undefined, request);
    if (claim.state !== 'claimed') {
      // No transaction was opened: nothing to roll back.
      await runner.release();
      return { claim };
    }
    let deferred: DeferredBegin | undefined;
    try {
      deferred = await this.deferBegin(runner, client);
    } catch (error) {
      return giveBackClaim(this.store, runner, request, error);
    }
    return { claim, attempt: openAttempt(this.parts, runner, request, { deferredBegin: deferred }) };
  }

  /**
   * TypeORM's `startTransaction()` on `runner` (the app's subscribers see the start), its START TRANSACTION deferred
   * to the work's first statement; sent and awaited on a client other than node-postgres's JavaScript one.
   */
  async deferBegin(runner: SourceQueryRunner, held?: PgClient): Promise<DeferredBegin | undefined> {
    const client = held ?? ((await runner.connect()) as PgClient);
    if (queryClassOf(client) === undefined) return startAtOnce(runner);
    let deferred: DeferredBegin | undefined;
    await withTransactionStatementReplaced(runner, 'START TRANSACTION', async (_client, statement) => {
      deferred = DeferredBegin.arm(runner, client, statement, this.parts.pools.main);
    });
    deferred?.watchRunner();
    return deferred;
  }
}
