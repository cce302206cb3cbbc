import { randomUUID } from 'node:crypto';
import type { ClaimRef, IdempotencyStore, PhaseState, StoredResponse } from '../store/idempotency-store.js';
import { FingerprintMismatchError, KeyInFlightError, LeaseLostError, StoreUnavailableError } from './errors.js';
import { Phases } from './phases.js';

/**
 * What to do with the claim when the work throws (CONTRACT A4.9).
 * - `store`: a definite outcome; the work's writes roll back and `response`
 *   is stored and replayed like a success.
 * - `release`: nothing took effect; delete the claim so a retry runs at once.
 * - `keep`: unknown outcome; leave the claim in flight until its lease ends.
 */
export type FailureDecision = { action: 'store'; response: StoredResponse } | { action: 'release' } | { action: 'keep' };

/** What identifies one idempotent unit of work, and how long it may hold and keep its key. */
export interface WorkScope {
  tenant: string;
  key: string;
  fingerprint: string;
  leaseMs: number;
  ttlMs: number;
  /** Classifies a failure of the work. */
  onFailure: (error: unknown) => FailureDecision;
}

export interface IdempotentWork<Tx, R> extends WorkScope {
  /** Runs inside the business transaction; `response` is stored in that same transaction. */
  run: (tx: Tx) => Promise<{ response: StoredResponse; result: R }>;
}

export interface PhasedWork<Tx, R> extends WorkScope {
  /** Runs with no surrounding transaction: each phase opens its own. `response` is stored once it returns. */
  run: (phases: Phases<Tx>) => Promise<{ response: StoredResponse; result: R }>;
  /** Wraps each phase's work, e.g. to expose its transaction through AsyncLocalStorage. */
  enterPhase?: <T>(tx: Tx, fn: () => Promise<T>) => Promise<T>;
}

export type EngineOutcome<R> =
  | { kind: 'executed'; response: StoredResponse; result: R }
  | { kind: 'replayed'; response: StoredResponse }
  /** The work failed and the policy stored `response`; `error` is what it threw. */
  | { kind: 'failure-stored'; response: StoredResponse; error: unknown };

/**
 * The state table of CONTRACT A3 in one place, with no knowledge of HTTP or
 * Nest: claim (committed alone), run the work and the fenced completion in
 * one transaction, and settle the claim when the work fails.
 */
export class IdempotencyEngine<Tx> {
  constructor(private readonly store: IdempotencyStore<Tx>) {}

  async execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    const claimed = await this.claim(work);
    if (claimed.kind === 'replayed') return claimed;
    const { ref } = claimed;
    try {
      const { response, result } = await this.store.transaction(async (tx) => {
        const done = await work.run(tx);
        // Fenced by the owner token inside the same transaction: if another
        // attempt took the key over, throwing here discards the work's writes.
        if (!(await this.store.complete(ref, done.response, work.ttlMs, tx))) throw new LeaseLostError();
        return done;
      });
      return { kind: 'executed', response, result };
    } catch (error) {
      return this.settleFailure(ref, work, error, false);
    }
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   */
  async executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    const claimed = await this.claim(work);
    if (claimed.kind === 'replayed') return claimed;
    const { ref, phases: recorded } = claimed;
    const phases = new Phases(this.store, ref, recorded, work.leaseMs, work.enterPhase);
    try {
      const { response, result } = await work.run(phases);
      if (!(await this.guard(() => this.store.complete(ref, response, work.ttlMs), 'unknown'))) throw new LeaseLostError();
      return { kind: 'executed', response, result };
    } catch (error) {
      return this.settleFailure(ref, work, error, phases.hasProgress);
    }
  }

  private async claim(
    work: WorkScope,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | { kind: 'claimed'; ref: ClaimRef; phases: PhaseState }> {
    const ref: ClaimRef = { tenant: work.tenant, key: work.key, ownerToken: randomUUID() };
    const claim = await this.guard(() =>
      this.store.claim({ ...ref, fingerprint: work.fingerprint, leaseMs: work.leaseMs, ttlMs: work.ttlMs }),
    );
    switch (claim.state) {
      case 'completed':
        return { kind: 'replayed', response: claim.response };
      case 'in-flight':
        throw new KeyInFlightError(claim.retryAfterSeconds);
      case 'mismatch':
        throw new FingerprintMismatchError();
      case 'claimed':
        return { kind: 'claimed', ref, phases: claim.phases };
    }
  }

  /**
   * @param hasProgress phases of this key are committed: releasing the key
   *   would throw their recovery points away, so `release` keeps it instead.
   */
  private async settleFailure<R>(
    ref: ClaimRef,
    work: WorkScope,
    error: unknown,
    hasProgress: boolean,
  ): Promise<EngineOutcome<R>> {
    if (error instanceof LeaseLostError) throw error;
    if (this.store.isUnavailableError(error)) {
      // Whether the commit happened is unknown; the lease decides what a retry sees.
      throw new StoreUnavailableError(error, 'unknown');
    }
    const decision = work.onFailure(error);
    switch (decision.action) {
      case 'store': {
        const stored = await this.guard(() => this.store.complete(ref, decision.response, work.ttlMs), 'unknown');
        if (!stored) throw new LeaseLostError();
        return { kind: 'failure-stored', response: decision.response, error };
      }
      case 'release':
        if (!hasProgress) await this.guard(() => this.store.release(ref), 'unknown');
        throw error;
      case 'keep':
        throw error;
    }
  }

  /** Runs a store step, turning "cannot reach the store" into `StoreUnavailableError` with what it means for the work. */
  private async guard<T>(step: () => Promise<T>, outcome: 'not-run' | 'unknown' = 'not-run'): Promise<T> {
    try {
      return await step();
    } catch (error) {
      if (this.store.isUnavailableError(error)) throw new StoreUnavailableError(error, outcome);
      throw error;
    }
  }
}
