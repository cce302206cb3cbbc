import { performance } from 'node:perf_hooks';
import type { BeginResult, ClaimMode, IdempotencyStore, StoredResponse } from './idempotency-store.js';
import { beginAttempt } from './begin-attempt.js';
import { ClaimsOnTheirWay } from './claims-on-their-way.js';
import type { CompletedAnswers } from './completed-answers.js';
import { answerNotFree, answeredBy, answeredByClaim, replayRemembered, type Replayed } from './duplicate-answers.js';
import { LeaseLostError, StoreUnavailableError } from './errors.js';
import { FailureHandling } from './failure-handling.js';
import type { Claimed } from './held.js';
import { claimRequest, heldBy, HeldKeys } from './held-keys.js';
import { observedClaim, observedComplete, observeExecution } from './engine-observation.js';
import type { Trace } from './trace.js';
import { SILENT_OBSERVER, type EngineObserver } from './observer.js';
import { Phases, type TransactionOutcome } from './phases.js';
import type { EngineOutcome, IdempotentWork, PhasedWork, WorkScope } from './work.js';

/** Longest pause between two looks at a key in flight elsewhere, while a duplicate waits for it. */
const MAX_WAIT_PAUSE_MS = 250;

/**
 * The state table (see the README), with no knowledge of HTTP or Nest: every execution follows `lifecycle`; the claim
 * mode says only where the claim goes, phased work that each phase commits alone. Failures: see failure-handling.ts.
 */
export class IdempotencyEngine<Tx> {
  private readonly held: HeldKeys<Tx>;
  private readonly failures: FailureHandling<Tx>;
  private readonly claimsOnTheirWay = new ClaimsOnTheirWay<Replayed | Claimed<Tx>>();
  private readonly isUnavailable = (error: unknown) => this.store.isUnavailableError(error);

  /** @param answers the answers this process completed or replayed, to replay from memory */
  constructor(
    private readonly store: IdempotencyStore<Tx>,
    private readonly observer: EngineObserver = SILENT_OBSERVER,
    private readonly answers?: CompletedAnswers,
  ) {
    this.held = new HeldKeys(store);
    this.failures = new FailureHandling(store, observer, answers);
  }

  execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    return (
      this.fromMemory<R>(work) ??
      observeExecution(this.observer, work, (trace) => this.lifecycle(work, work.claimMode ?? 'separate', undefined, trace))
    );
  }

  /** Like `execute`, for work written as phases (see `Phases`); always claimed separately. */
  executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    return (
      this.fromMemory<R>(work) ?? observeExecution(this.observer, work, (trace) => this.lifecycle(work, 'separate', work, trace))
    );
  }

  /** Before anything else, with no I/O: the answer this process remembers for the key, if any. */
  private fromMemory<R>(work: WorkScope): Promise<EngineOutcome<R>> | undefined {
    const remembered = work.replayFromMemory ? this.answers?.get(work.tenant, work.key) : undefined;
    return remembered && replayRemembered(this.observer, work, remembered);
  }

  /** An operator ended the lease of this process's attempt on `(tenant, key)`: duplicates here ask the store. */
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
    // 1. A duplicate of an execution running here, or (default mode) of a claim this process has on its way,
    // is answered from it without a round trip of its own.
    const answers = work.replayFromMemory ? this.answers : undefined;
    const running = this.held.running(work);
    const fromRunning = running && (await answeredBy(running, work, deadline));
    if (fromRunning) return fromRunning;
    const shares = mode === 'separate' && !phased;
    const joined = shares ? this.claimsOnTheirWay.find(work) : undefined;
    const fromJoined = joined && (await answeredByClaim(joined, this.held, work, deadline));
    if (fromJoined) return fromJoined;

    // 2. Claim the key and open the work's transaction, or answer as the state table says.
    const claiming = this.claim(work, mode, phased === undefined, deadline, trace);
    const claimed = await (shares ? this.claimsOnTheirWay.share(work, claiming) : claiming);
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
        return (outcome = await this.failures.fail(work, claimed, error, trace, phases?.hasProgress));
      }

      // 4. Complete the key, fenced by the owner token, and COMMIT it with the work (phases committed their own).
      let completed: boolean;
      const completedAt = performance.now();
      try {
        completed = await observedComplete(this.observer, () =>
          transaction ? transaction.commit(done.response, work.ttlMs) : this.store.complete(held.ref, done.response, work.ttlMs),
        );
      } catch (error) {
        return (outcome = await this.failures.commitFailed(work, claimed, error, trace));
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
   * Step 2. With `waitMs`, a duplicate of an attempt in flight elsewhere waits for it: in request-transaction
   * mode on the row's lock; otherwise looking again at growing intervals, holding no connection meanwhile.
   */
  private async claim(
    work: WorkScope,
    mode: ClaimMode,
    opensTransaction: boolean,
    deadline: number,
    trace: Trace,
  ): Promise<Replayed | Claimed<Tx>> {
    for (let pause = 20; ; pause = Math.min(pause * 2, MAX_WAIT_PAUSE_MS)) {
      const request = claimRequest(work);
      const sentAt = performance.now();
      const begun = await observedClaim(this.observer, this.isUnavailable, work, (): Promise<BeginResult<Tx>> =>
        opensTransaction
          ? this.store.begin
            ? this.store.begin(request, mode, work.waitMs ?? 0)
            : beginAttempt(this.store, request, mode, work.waitMs ?? 0)
          : this.store.claim(request).then((claim) => ({ claim }) as BeginResult<Tx>),
      );
      const { claim } = begun;
      if (claim.state === 'claimed') {
        trace.attempt = claim.attempt;
        return { mode, held: heldBy(work, request, claim), transaction: begun.attempt };
      }
      const answer = await answerNotFree(claim, work, mode, deadline, pause, this.answers, sentAt);
      if (answer) return answer;
    }
  }
}
