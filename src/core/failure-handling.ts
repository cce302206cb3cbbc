import { performance } from 'node:perf_hooks';
import type { IdempotencyStore, StoredResponse } from './idempotency-store.js';
import type { CompletedAnswers } from './completed-answers.js';
import { CommitRefusedError, LeaseLostError } from './errors.js';
import { leaseSecondsLeft, type Claimed } from './held.js';
import { claimRequest, heldBy } from './held-keys.js';
import { observedClaim, observedComplete } from './engine-observation.js';
import type { Trace } from './trace.js';
import type { EngineObserver } from './observer.js';
import { storeFailure, type FailureDecision } from './outcomes.js';
import type { EngineOutcome, WorkScope } from './work.js';

/**
 * What the engine does when an attempt's work fails, or its completion does
 * not go through: the work's writes are rolled back, the failure classified
 * once by the work's `onFailure` (see `outcomes.ts`), and the key stored with
 * the failure's response, released or kept. A new key that succeeds runs
 * none of it.
 */
export class FailureHandling<Tx> {
  private readonly isUnavailable = (error: unknown) => this.store.isUnavailableError(error);

  constructor(
    private readonly store: IdempotencyStore<Tx>,
    private readonly observer: EngineObserver,
    private readonly answers?: CompletedAnswers,
  ) {}

  /**
   * The completion (and COMMIT) of work that succeeded threw `error`. A
   * store that cannot be reached leaves the outcome unknown; a COMMIT the
   * database refused means the work's writes did not happen: the work's
   * failure, classified as such.
   */
  async commitFailed<R>(work: WorkScope, claimed: Claimed<Tx>, error: unknown, trace: Trace): Promise<EngineOutcome<R>> {
    const failure = this.afterWorkStarted(error, claimed);
    if (failure !== error || !claimed.transaction) throw failure;
    return this.fail(work, { ...claimed, transaction: undefined }, new CommitRefusedError(error), trace);
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
  async fail<R>(
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
    const request = claimRequest(work);
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
      throw this.afterWorkStarted(error, claimed);
    }
  }

  /**
   * A store call that failed after the work started. When the store cannot
   * be reached, a retry can find the key free: after a separate claim's
   * lease ends (whatever happened to the COMMIT); in `request-transaction`
   * mode nothing is held once the transaction is gone, so as soon as the
   * store answers.
   */
  private afterWorkStarted(error: unknown, claimed: Claimed<Tx>): unknown {
    const retryAfter = claimed.mode === 'separate' ? leaseSecondsLeft(claimed.held) : undefined;
    return storeFailure(error, this.isUnavailable, 'after-work-started', retryAfter);
  }
}
