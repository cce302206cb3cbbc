import { performance } from 'node:perf_hooks';
import type { EntityManager, QueryRunner } from 'typeorm';
import type { BeginResult, ClaimMode, ClaimRequest } from '../../core/idempotency-store.js';
import { endAndRelease, openAttempt, type AttemptParts } from './attempt.js';
import type { PipelinedResult } from './pipelined.js';
import { DeferredBegin } from './deferred-begin.js';
import { exchange, type PgClient } from './pools.js';
import type { PostgresIdempotencyStore } from './postgres-idempotency.store.js';
import { RequestTransactionBegin } from './request-transaction.js';
import { BEGIN_READ_COMMITTED, claimResult, lockTaken, type ClaimRow } from './statements.js';
import { withTransactionStatementReplaced } from './typeorm-transaction-hook.js';
import { isUnavailableError } from './unavailable.js';

/** The store's own calls `begin` goes through (a subclass's overrides included). */
type KeyCalls = Pick<PostgresIdempotencyStore, 'claim' | 'release' | 'renewLease'>;

/**
 * `PostgresIdempotencyStore.begin`: the claim and the BEGIN of the work's
 * transaction in one round trip, on the connection the work then uses.
 */
export class ClaimAndBegin {
  private readCommitted?: Promise<boolean>;
  private readonly requestTransaction: RequestTransactionBegin;

  constructor(
    private readonly store: KeyCalls,
    private readonly parts: AttemptParts,
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
    return this.parts.routing.claimPoolFirst() ? this.beginAfterClaimPool(request) : this.beginHoldingKeyLock(request);
  }

  /**
   * A separate claim whose work runs under REPEATABLE READ or SERIALIZABLE: the claim, its COMMIT, the work's BEGIN
   * and the key's lock in that transaction (see `KeyStatements.holdKeyLock`), in one round trip.
   */
  private async beginHoldingKeyLock(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    const { pools, statements, routing } = this.parts;
    const runner = pools.main.createQueryRunner();
    const claimStatement = statements.claim(request, 'claim', null);
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
      await endAndRelease(runner, error);
      // The claim may have committed before the BEGIN failed or the connection was lost: give it back if the store
      // still answers, so a retry need not wait out the lease.
      await this.store.release(request).catch(() => false);
      throw error;
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
    if (!lockTaken(results[4])) return this.notRun(runner, request);
    return { claim, attempt: openAttempt(this.parts, runner, request, { holdsKeyLock: true }) };
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
    if (!routing.mainPoolHasRoom()) return this.beginAfterClaimPool(request);
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
  private async deferBegin(runner: QueryRunner, held?: PgClient): Promise<DeferredBegin | undefined> {
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

  /**
   * A separate claim on the claim pool, then the work's BEGIN once the main
   * pool lends a connection. That wait has no heartbeat: when it outlasted a
   * third of the lease, the lease is renewed, fenced, before the work starts
   * (the engine's heartbeat then beats within the lease). A claim taken over
   * meanwhile is not run: its key is another attempt's now, in flight.
   */
  private async beginAfterClaimPool(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    const { pools, statements, routing } = this.parts;
    const claimedAt = performance.now();
    const claim = await this.store.claim(request);
    routing.noteClaim(claim);
    if (claim.state !== 'claimed') return { claim };
    const runner = pools.main.createQueryRunner();
    let stillOurs = true;
    let holdsKeyLock: boolean;
    let deferred: DeferredBegin | undefined;
    try {
      holdsKeyLock = !(await this.businessReadCommitted());
      if (holdsKeyLock) await runner.startTransaction();
      else deferred = await this.deferBegin(runner);
      if (performance.now() - claimedAt > request.leaseMs / 3) stillOurs = await this.store.renewLease(request, request.leaseMs);
      if (stillOurs && holdsKeyLock) {
        const { rows } = await pools.run(statements.holdKeyLock(request), { tx: runner.manager });
        if (!(rows as Array<{ locked: boolean }>)[0]?.locked) return await this.notRun(runner, request);
      }
    } catch (error) {
      await endAndRelease(runner, error);
      // The work never ran: give the claim back, so a retry need not wait out the lease.
      await this.store.release(request).catch(() => false);
      throw error;
    }
    if (!stillOurs) {
      void endAndRelease(runner);
      return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
    }
    return { claim, attempt: openAttempt(this.parts, runner, request, { holdsKeyLock, deferredBegin: deferred }) };
  }

  /** The claim is this attempt's, but its transaction could not hold the key's lock: give it back, run nothing. */
  private async notRun(runner: QueryRunner, request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    await endAndRelease(runner);
    await this.store.release(request).catch(() => false);
    return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
  }
}
