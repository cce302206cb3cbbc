import type { EntityManager } from 'typeorm';
import type { SourceQueryRunner } from '../connection.js';
import { IdempotencyStore, type BeginResult, type ClaimMode, type ClaimRequest } from '../../core/idempotency-store.js';
import { openAttempt } from './attempt.js';
import type { AttemptParts } from './attempt-parts.js';
import { endAndRelease } from './end-and-release.js';
import type { PipelinedResult } from './pipelined.js';
import { DeferredBegin } from './deferred-begin.js';
import type { PgClient } from './pools.js';
import type { PostgresIdempotencyStore } from './postgres-idempotency.store.js';
import { RequestTransactionBegin } from './request-transaction.js';
import { beginAfterClaimPool } from './begin-after-claim-pool.js';
import { beginHoldingKeyLock } from './begin-holding-key-lock.js';
import { claimResult, type ClaimRow } from './claim-statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { isUnavailableError } from './unavailable.js';

/** The store's own calls `begin` goes through (a subclass's overrides included). */
type KeyCalls = Pick<PostgresIdempotencyStore, 'claim' | 'release' | 'renewLease'>;

/** `PostgresIdempotencyStore`'s `begin`, here with the rest of a new key's path; the store's other calls are in its own file. */
export abstract class BeginningStore extends IdempotencyStore<EntityManager> {
  protected abstract readonly claimAndBegin: ClaimAndBegin;

  /**
   * The claim and the BEGIN of the work's transaction in one round trip, on
   * the connection the work then uses: one pipeline of parameterised
   * statements (see `pipelined`), no value ever in a statement's text.
   *
   * - `separate`: `BEGIN ISOLATION LEVEL READ COMMITTED`, the claim, `COMMIT`,
   *   `START TRANSACTION`. The claim commits on its own (another connection
   *   sees it at once; a later ROLLBACK leaves it), durably: the work may use
   *   its generation in calls to other systems before its own COMMIT, and a
   *   retry after a crash of the database must find that same generation.
   *   It runs at READ COMMITTED whatever the server's, the database's or the
   *   role's default, so a concurrent claim's commit is read, never a
   *   serialization failure. When the main pool has no connection free, the
   *   claim goes to the claim pool instead, so that replays and 409s never
   *   queue behind business transactions, and the BEGIN follows once a
   *   connection is free (see claim-routing.ts).
   * - `request-transaction`: `START TRANSACTION`, the claim, `SAVEPOINT`. The
   *   savepoint lets a failure's response be stored under the key's lock, so a
   *   duplicate waiting on it finds the stored answer. The transaction keeps
   *   the app's isolation level; under a stricter one than READ COMMITTED a
   *   claim whose snapshot predates the key's last commit fails with a
   *   serialization failure, and the transaction starts again (the
   *   partitioned table refuses the mode there).
   *
   * Behind PgBouncer in transaction pooling the pipeline ends inside an open
   * transaction, so the server connection stays with this client.
   */
  override async begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs = 0): Promise<BeginResult<EntityManager>> {
    return this.claimAndBegin.begin(request, mode, lockTimeoutMs);
  }
}

/** The store's `begin`: the claim and the work's BEGIN in one round trip, on the connection the work then uses. */
export class ClaimAndBegin {
  private readCommitted?: Promise<boolean>;
  private readonly requestTransaction: RequestTransactionBegin;

  constructor(
    readonly store: KeyCalls,
    readonly parts: AttemptParts,
    table: { name: string; partitioned: boolean },
  ) {
    this.requestTransaction = new RequestTransactionBegin(parts, table, () => this.businessReadCommitted());
  }

  /** See `PostgresIdempotencyStore.begin`. */
  begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs: number): Promise<BeginResult<EntityManager>> {
    return mode === 'request-transaction' ? this.requestTransaction.begin(request, lockTimeoutMs) : this.beginOnce(request);
  }

  /**
   * Whether the work's transactions run at READ COMMITTED (or READ UNCOMMITTED, the same in PostgreSQL): the data
   * source's `isolationLevel`, else the default a connection of its pool gets (the server's, the database's, the
   * role's or the connection's own), read once.
   */
  businessReadCommitted(): Promise<boolean> {
    const { pools } = this.parts;
    this.readCommitted ??= (async () => {
      const level = pools.main.options.isolationLevel;
      if (level) return level === 'READ COMMITTED' || level === 'READ UNCOMMITTED';
      const { rows } = await pools.run({ text: 'SHOW default_transaction_isolation', values: [] }, { source: pools.main });
      const shown = (rows as Array<{ default_transaction_isolation: string }>)[0]?.default_transaction_isolation;
      return shown === 'read committed' || shown === 'read uncommitted';
    })().catch((error: unknown) => {
      this.readCommitted = undefined;
      throw error;
    });
    return this.readCommitted;
  }

  /** A separate claim: see `beginSeparate` (READ COMMITTED work), else `beginHoldingKeyLock`. */
  private async beginOnce(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    if (await this.businessReadCommitted()) return this.beginSeparate(request);
    return this.parts.routing.claimPoolFirst() ? beginAfterClaimPool(this, request) : beginHoldingKeyLock(this, request);
  }

  /**
   * A separate claim whose work runs at READ COMMITTED: the claim committed
   * on its own (see `SeparateClaim`) in one round trip on the connection the
   * work then uses, and no transaction opened by it. The
   * work's own BEGIN goes out with its first statement (see DeferredBegin), so
   * a new key still costs three round trips, and a replay, a 409 or a 422 one,
   * with nothing to roll back. When the main pool has no room the claim goes
   * to the claim pool instead, so those never queue behind business
   * transactions (see claim-routing.ts).
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
      await endAndRelease(runner, error);
      // Give the claim back if the store still answers, so a retry need not wait out the lease.
      await this.store.release(request).catch(() => false);
      throw error;
    }
    if (!claimed.ok || !committed.ok) {
      // The COMMIT answered ROLLBACK: nothing committed, and the connection is idle again.
      await runner.release();
      throw claimed.ok ? (committed as { error: unknown }).error : claimed.error;
    }
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
      await endAndRelease(runner, error);
      await this.store.release(request).catch(() => false);
      throw error;
    }
    return { claim, attempt: openAttempt(this.parts, runner, request, { deferredBegin: deferred }) };
  }

  /**
   * TypeORM's `startTransaction()` on `runner` (the app's subscribers see the
   * transaction start), its START TRANSACTION deferred to the work's first
   * statement. On a client the BEGIN cannot be written ahead of a statement
   * on (not node-postgres's JavaScript client), it is sent and awaited.
   */
  async deferBegin(runner: SourceQueryRunner, held?: PgClient): Promise<DeferredBegin | undefined> {
    const client = held ?? ((await runner.connect()) as PgClient);
    if (!DeferredBegin.canDefer(client)) {
      await runner.startTransaction();
      return undefined;
    }
    let deferred: DeferredBegin | undefined;
    await withTransactionStatementReplaced(runner, 'START TRANSACTION', async (_client, statement) => {
      deferred = DeferredBegin.arm(runner, client, statement, this.parts.pools.main);
    });
    deferred?.watchRunner();
    return deferred;
  }
}
