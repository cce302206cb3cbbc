import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type { BeginResult, ClaimMode, ClaimRequest, ClaimResult, IdempotencyStore, StoredResponse } from './idempotency-store.js';
import { beginAttempt } from './begin-attempt.js';
import type { CompletedAnswers } from './completed-answers.js';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './errors.js';
import { HeldKeys, type Claimed, type Held } from './held-keys.js';
import { observedClaim, observedComplete, observeExecution, type Trace } from './engine-observation.js';
import { SILENT_OBSERVER, type EngineObserver } from './observer.js';
import { storeFailure, type FailureDecision } from './outcomes.js';
import { Phases, type TransactionOutcome } from './phases.js';
import type { ClaimInfo, EngineOutcome, IdempotentWork, PhasedWork, WorkScope } from './work.js';

export type { ClaimMode } from './idempotency-store.js';
export type { FailureDecision } from './outcomes.js';
export type { ClaimInfo, EngineOutcome, IdempotentWork, PhasedWork, WorkScope } from './work.js';

/** Longest pause between two looks at a key in flight elsewhere, while a duplicate waits for it. */
const MAX_WAIT_PAUSE_MS = 250;

/**
 * The state table (see the README) in one place, with no knowledge of HTTP or
 * Nest. Every execution follows one lifecycle, read top to bottom in
 * `lifecycle`; the claim mode says only where the claim goes (committed
 * alone, or the transaction's first statement), and phased work only that
 * each phase commits on its own.
 *
 * A failure of the work, or a COMMIT the database refuses (its writes did
 * not happen either), rolls the work back and is classified once, by
 * `onFailure` (see `outcomes.ts`). Only the store's own calls failing to
 * reach the database raise `StoreUnavailableError`.
 */
export class IdempotencyEngine<Tx> {
  private readonly held: HeldKeys<Tx>;
  private readonly isUnavailable = (error: unknown) => this.store.isUnavailableError(error);

  /**
   * @param answers the answers this process completed or replayed, to replay from memory;
   *   without it every replay asks the store
   */
  constructor(
    private readonly store: IdempotencyStore<Tx>,
    private readonly observer: EngineObserver = SILENT_OBSERVER,
    private readonly answers?: CompletedAnswers,
  ) {
    this.held = new HeldKeys(store);
  }

  execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    return observeExecution(this.observer, work, (trace) => this.lifecycle(work, work.claimMode ?? 'separate', undefined, trace));
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   * Always claimed separately: each phase commits on its own.
   */
  executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    return observeExecution(this.observer, work, (trace) => this.lifecycle(work, 'separate', work, trace));
  }

  /**
   * Someone ended the lease of this process's attempt on `(tenant, key)` in
   * the store (the operator board): duplicates arriving here ask the store.
   */
  forgetLease(tenant: string, key: string): void {
    this.held.forgetLease(tenant, key);
  }

  /** One execution, claim to settle. `phased` is the work when it runs as phases (no transaction around it). */
  private async lifecycle<R>(
    work: WorkScope,
    mode: ClaimMode,
    phased: PhasedWork<Tx, R> | undefined,
    trace: Trace,
  ): Promise<EngineOutcome<R>> {
    const deadline = Date.now() + (work.waitMs ?? 0);

    // 1. A duplicate of an execution completed or running in this process is answered from it, without a round trip.
    const answers = work.replayFromMemory ? this.answers : undefined;
    const remembered = answers?.get(work.tenant, work.key);
    if (remembered) {
      if (remembered.fingerprint !== work.fingerprint) throw new FingerprintMismatchError();
      return { kind: 'replayed', response: remembered.response };
    }
    const running = this.held.running(work);
    if (running) {
      if (running.fingerprint !== work.fingerprint) throw new FingerprintMismatchError();
      if (!work.waitMs) throw new KeyInFlightError(secondsUntil(running.held.leaseEndsAt));
      const response = await this.held.settled(running, deadline);
      if (response) return { kind: 'replayed', response };
    }

    // 2. Claim the key and open the work's transaction, or answer as the state table says.
    const claimed = await this.claim(work, mode, phased === undefined, deadline, trace);
    if ('kind' in claimed) return claimed;
    const settle = this.held.hold(work, claimed);
    const { held, transaction } = claimed;
    let ending: ((outcome: TransactionOutcome) => void) | undefined;
    let outcome: EngineOutcome<R> | undefined;
    try {
      // 3. Run the work: in its transaction, or phase by phase.
      let done: { response: StoredResponse; result: R };
      let phases: Phases<Tx> | undefined;
      try {
        if (phased) {
          phases = new Phases(this.store, held.ref, held.claim.generation, held.phases, work.leaseMs, phased.enterPhase);
          done = await phased.run(phases, held.claim);
        } else {
          const ended = new Promise<TransactionOutcome>((resolve) => (ending = resolve));
          done = await (work as IdempotentWork<Tx, R>).run(transaction!.tx, held.claim, ended);
        }
      } catch (error) {
        // Ended at maxHold, the work failed because its transaction was taken from it: not an outcome of its own.
        if (claimed.holdExceeded) throw new LeaseLostError();
        // Phases report their own store calls' failures as these two; anything else is the work's.
        if (phases && (error instanceof LeaseLostError || error instanceof StoreUnavailableError)) throw error;
        return (outcome = await this.fail(work, claimed, error, trace, phases?.hasProgress));
      }

      // 4. Complete the key, fenced by the owner token, and COMMIT it with the work (phases committed their own).
      let completed: boolean;
      const completedAt = performance.now();
      try {
        completed = await observedComplete(this.observer, () =>
          transaction ? transaction.commit(done.response, work.ttlMs) : this.store.complete(held.ref, done.response, work.ttlMs),
        );
      } catch (error) {
        const failure = storeFailure(error, this.isUnavailable, 'after-work-started', this.retryAfter(claimed));
        if (failure !== error || !transaction) throw failure;
        // The database answered, and no: the work's writes did not happen, which is the work's failure.
        return (outcome = await this.fail(work, { ...claimed, transaction: undefined }, new CommitRefusedError(error), trace));
      }
      if (!completed) throw new LeaseLostError();
      answers?.remember(work.tenant, work.key, work.fingerprint, done.response, work.ttlMs, completedAt);
      return (outcome = { kind: 'executed', ...done });
    } catch (error) {
      ending?.(error instanceof StoreUnavailableError && error.outcome === 'unknown' ? 'unknown' : 'rolled-back');
      throw error;
    } finally {
      // 5. Settle: only now, after the commit, may a duplicate waiting here (or the caller) see the outcome.
      ending?.(outcome?.kind === 'executed' ? 'committed' : 'rolled-back');
      settle(outcome?.response);
    }
  }

  /**
   * Step 2: claims the key (and opens the work's transaction), or answers as
   * the state table says. With `waitMs`, a duplicate of an attempt in flight
   * elsewhere waits for it: in `request-transaction` mode on the claimed
   * row's lock; otherwise looking again at growing intervals (each look one
   * short statement, no connection held while waiting) until the time is up,
   * then it gets the 409.
   */
  private async claim(
    work: WorkScope,
    mode: ClaimMode,
    opensTransaction: boolean,
    deadline: number,
    trace: Trace,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | Claimed<Tx>> {
    for (let pause = 20; ; pause = Math.min(pause * 2, MAX_WAIT_PAUSE_MS)) {
      const request = this.request(work);
      const sentAt = performance.now();
      const begun = await observedClaim(this.observer, this.isUnavailable, work, (): Promise<BeginResult<Tx>> =>
        opensTransaction
          ? this.store.begin
            ? this.store.begin(request, mode, work.waitMs ?? 0)
            : beginAttempt(this.store, request, mode, work.waitMs ?? 0)
          : this.store.claim(request).then((claim) => ({ claim }) as BeginResult<Tx>),
      );
      const { claim } = begun;
      switch (claim.state) {
        case 'completed':
          // Remembered as a completion is, for no longer than the store says the record lives.
          if (work.replayFromMemory && claim.recordExpiresInSeconds !== undefined)
            this.answers?.remember(
              work.tenant,
              work.key,
              work.fingerprint,
              claim.response,
              claim.recordExpiresInSeconds * 1000,
              sentAt,
            );
          return { kind: 'replayed', response: claim.response };
        case 'mismatch':
          throw new FingerprintMismatchError();
        case 'in-flight': {
          const left = deadline - Date.now();
          // In request-transaction mode the claim already waited on the row lock.
          if (mode === 'request-transaction' || left <= 0) throw new KeyInFlightError(claim.retryAfterSeconds);
          await sleep(Math.min(pause, left, claim.retryAfterSeconds * 1000));
          continue;
        }
        case 'claimed':
          trace.attempt = claim.attempt;
          return { mode, held: heldBy(work, request, claim), transaction: begun.attempt };
      }
    }
  }

  /**
   * The work failed (or its COMMIT was refused). Its writes are undone
   * first, so its locks are not held while the failure is classified; in
   * `request-transaction` mode the claim itself stays locked meanwhile, so a
   * stored failure is the answer for every duplicate waiting on it too.
   *
   * @param hasProgress phases of this key are committed: releasing the key
   *   would throw their recovery points away, so `release` keeps it instead.
   */
  private async fail<R>(
    work: WorkScope,
    claimed: Claimed<Tx>,
    error: unknown,
    trace: Trace,
    hasProgress = false,
  ): Promise<EngineOutcome<R>> {
    const { mode, held, transaction } = claimed;
    const claimKept = transaction ? await this.guard(() => transaction.rollback(mode === 'request-transaction'), claimed) : false;
    let decision: FailureDecision;
    try {
      decision = await work.onFailure(error);
    } catch (classifying) {
      if (claimKept) await transaction!.rollback(false).catch(() => undefined);
      throw classifying;
    }
    if (decision.action === 'store') {
      const { response } = decision;
      const completedAt = performance.now();
      const stored = await this.guard(
        () =>
          claimKept
            ? observedComplete(this.observer, () => transaction!.commit(response, work.ttlMs))
            : mode === 'separate'
              ? observedComplete(this.observer, () => this.store.complete(held.ref, response, work.ttlMs))
              : this.storeAnew(work, response),
        claimed,
      );
      // In request-transaction mode a lost race only means another attempt's outcome stands; this client still gets its own.
      if (!stored && mode === 'separate') throw new LeaseLostError();
      if (stored && work.replayFromMemory)
        this.answers?.remember(work.tenant, work.key, work.fingerprint, response, work.ttlMs, completedAt);
      return { kind: 'failure-stored', response, error };
    }
    if (claimKept) await this.guard(() => transaction!.rollback(false), claimed);
    if (mode === 'request-transaction') {
      // The claim rolled back with the work: the key is free again either way.
      trace.failure = 'released';
    } else if (decision.action === 'release' && !hasProgress) {
      await this.guard(() => this.store.release(held.ref, decision.forget), claimed);
      trace.failure = 'released';
    } else trace.failure = 'kept';
    throw error;
  }

  /**
   * A failure's response to store in `request-transaction` mode once its
   * transaction is gone (its COMMIT was refused): claimed and completed on
   * its own. False when another attempt got the key in between.
   */
  private async storeAnew(work: WorkScope, response: StoredResponse): Promise<boolean> {
    const request = this.request(work);
    const { claim } = await observedClaim(this.observer, this.isUnavailable, work, () =>
      this.store.claim(request).then((c) => ({ claim: c })),
    );
    if (claim.state !== 'claimed') return false;
    const held = heldBy(work, request, claim);
    return this.guard(() => observedComplete(this.observer, () => this.store.complete(held.ref, response, work.ttlMs)), {
      mode: 'separate',
      held,
    });
  }

  /** Runs a store call made after the work started, turning "cannot reach the store" into an unknown outcome. */
  private async guard<T>(step: () => Promise<T>, claimed: Claimed<Tx>): Promise<T> {
    try {
      return await step();
    } catch (error) {
      throw storeFailure(error, this.isUnavailable, 'after-work-started', this.retryAfter(claimed));
    }
  }

  /**
   * When a retry can find the key free after the store was lost mid-attempt:
   * a separate claim is held until its lease ends (whatever happened to the
   * COMMIT); in `request-transaction` mode nothing is held once the
   * transaction is gone, so a retry can run as soon as the store answers.
   */
  private retryAfter(claimed: Claimed<Tx>): number | undefined {
    return claimed.mode === 'separate' ? secondsUntil(claimed.held.leaseEndsAt) : undefined;
  }

  private request(work: WorkScope): ClaimRequest {
    return {
      tenant: work.tenant,
      key: work.key,
      ownerToken: randomUUID(),
      fingerprint: work.fingerprint,
      leaseMs: work.leaseMs,
      ttlMs: work.ttlMs,
    };
  }
}

function heldBy(work: WorkScope, request: ClaimRequest, claim: Extract<ClaimResult, { state: 'claimed' }>): Held {
  const info: ClaimInfo = { attempt: claim.attempt, generation: claim.generation };
  return {
    ref: { tenant: request.tenant, key: request.key, ownerToken: request.ownerToken },
    claim: info,
    phases: claim.phases,
    leaseEndsAt: Date.now() + work.leaseMs,
  };
}

function secondsUntil(at: number): number {
  return Math.max(1, Math.ceil((at - Date.now()) / 1000));
}
