import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type { BeginResult, ClaimMode, IdempotencyStore, StoredResponse } from './idempotency-store.js';
import { beginAttempt } from './begin-attempt.js';
import { ClaimsOnTheirWay } from './claims-on-their-way.js';
import type { CompletedAnswers } from './completed-answers.js';
import { FingerprintMismatchError, KeyInFlightError, LeaseLostError, StoreUnavailableError } from './errors.js';
import { FailureHandling } from './failure-handling.js';
import { claimRequest, heldBy, HeldKeys, leaseSecondsLeft, type Claimed, type LocalExecution } from './held-keys.js';
import { observedClaim, observedComplete, observeExecution, type Trace } from './engine-observation.js';
import { SILENT_OBSERVER, type EngineObserver } from './observer.js';
import { Phases, type TransactionOutcome } from './phases.js';
import type { EngineOutcome, IdempotentWork, PhasedWork, WorkScope } from './work.js';

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
 * `onFailure`: see `failure-handling.ts`. Only the store's own calls failing
 * to reach the database raise `StoreUnavailableError`.
 */
export class IdempotencyEngine<Tx> {
  private readonly held: HeldKeys<Tx>;
  private readonly failures: FailureHandling<Tx>;
  private readonly claimsOnTheirWay = new ClaimsOnTheirWay<{ kind: 'replayed'; response: StoredResponse } | Claimed<Tx>>();
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
    this.failures = new FailureHandling(store, observer, answers);
  }

  execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    return (
      this.fromMemory<R>(work) ??
      observeExecution(this.observer, work, (trace) => this.lifecycle(work, work.claimMode ?? 'separate', undefined, trace))
    );
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   * Always claimed separately: each phase commits on its own.
   */
  executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    return (
      this.fromMemory<R>(work) ?? observeExecution(this.observer, work, (trace) => this.lifecycle(work, 'separate', work, trace))
    );
  }

  /**
   * Step 1, before anything else: the answer to a key this process completed or replayed, kept in memory
   * (`replayFromMemory`), compared by fingerprint as the store would. It does no I/O, so it gets its outcome event
   * and no span; and it is decided now, with no promise chain of the lifecycle's around it (a retry storm is when
   * replays must cost least). Undefined when there is no such answer.
   */
  private fromMemory<R>(work: WorkScope): Promise<EngineOutcome<R>> | undefined {
    const remembered = work.replayFromMemory ? this.answers?.get(work.tenant, work.key) : undefined;
    if (!remembered) return undefined;
    const same = remembered.fingerprint === work.fingerprint;
    this.observer.emit(
      { type: 'outcome', outcome: same ? 'replayed' : 'mismatch', route: work.label ?? 'execute', durationMs: 0 },
      work.tenant,
    );
    return same
      ? Promise.resolve({ kind: 'replayed', response: remembered.response })
      : Promise.reject(new FingerprintMismatchError());
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

    // 1. A duplicate of an execution running in this process is answered from it, without a round trip (one this
    // process completed was answered from memory before the lifecycle began: see `fromMemory`).
    const answers = work.replayFromMemory ? this.answers : undefined;
    const running = this.held.running(work);
    const fromRunning = running && (await this.answeredBy(running, work, deadline));
    if (fromRunning) return fromRunning;

    // 2. Claim the key and open the work's transaction, or answer as the state table says. In the default mode, a
    // duplicate of a claim this process has on its way waits for its answer instead (see claims-on-their-way.ts):
    // the same replay, or the execution it started, found running here.
    const shares = mode === 'separate' && !phased;
    const joined = shares ? this.claimsOnTheirWay.find(work) : undefined;
    if (joined) {
      const answer = await joined.catch(() => undefined);
      if (answer && 'kind' in answer) return answer;
      const started = answer && this.held.running(work);
      const fromJoined = started && (await this.answeredBy(started, work, deadline));
      if (fromJoined) return fromJoined;
      // It failed, found the key held elsewhere (perhaps completed since), or its execution ended with no answer.
    }
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

  /** A duplicate of `running`, answered from it: 422 for another request, 409 when it may not wait, else its response once committed. */
  private async answeredBy(
    running: LocalExecution,
    work: WorkScope,
    deadline: number,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | undefined> {
    if (running.fingerprint !== work.fingerprint) throw new FingerprintMismatchError();
    if (!work.waitMs) throw new KeyInFlightError(leaseSecondsLeft(running.held));
    const response = await this.held.settled(running, deadline);
    return response ? { kind: 'replayed', response } : undefined;
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
}
