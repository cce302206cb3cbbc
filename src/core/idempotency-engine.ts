import { randomUUID } from 'node:crypto';
import type { ClaimRef, IdempotencyStore, PhaseState, StoredResponse } from '../store/idempotency-store.js';
import { FingerprintMismatchError, KeyInFlightError, LeaseLostError, StoreUnavailableError, WorkFailure } from './errors.js';
import { Phases } from './phases.js';

/**
 * What to do with the claim when the work throws (see "Handler outcomes" in the README).
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
  /**
   * Classifies an error thrown by the work (never one of the store's), once
   * the work's transaction has rolled back. May wait, e.g. for the response
   * an HTTP exception filter renders.
   */
  onFailure: (error: unknown) => FailureDecision | Promise<FailureDecision>;
}

/** The claim an execution holds while its work runs. */
export interface ClaimInfo {
  /** 1 for a fresh claim, then one more for each takeover. */
  attempt: number;
  /** The same for every attempt of one use of the key, new once it expired: derived downstream keys hang off it. */
  generation: string;
}

export interface IdempotentWork<Tx, R> extends WorkScope {
  /** Runs inside the business transaction; `response` is stored in that same transaction. */
  run: (tx: Tx, claim: ClaimInfo) => Promise<{ response: StoredResponse; result: R }>;
}

export interface PhasedWork<Tx, R> extends WorkScope {
  /** Runs with no surrounding transaction: each phase opens its own. `response` is stored once it returns. */
  run: (phases: Phases<Tx>, claim: ClaimInfo) => Promise<{ response: StoredResponse; result: R }>;
  /** Wraps each phase's work, e.g. to expose its transaction through AsyncLocalStorage. */
  enterPhase?: <T>(tx: Tx, fn: () => Promise<T>) => Promise<T>;
}

export type EngineOutcome<R> =
  | { kind: 'executed'; response: StoredResponse; result: R }
  | { kind: 'replayed'; response: StoredResponse }
  /** The work failed and the policy stored `response`; `error` is what it threw. */
  | { kind: 'failure-stored'; response: StoredResponse; error: unknown };

/** A claim this attempt holds, and until when (by this process's clock: only for `Retry-After` hints). */
interface Held {
  ref: ClaimRef;
  claim: ClaimInfo;
  phases: PhaseState;
  leaseEndsAt: number;
}

/**
 * The state table (see the README) in one place, with no knowledge of HTTP or
 * Nest: claim (committed alone), run the work and the fenced completion in
 * one transaction, and settle the claim when the work fails.
 *
 * Whose failure it is decides the answer. Only the store's own calls (claim,
 * BEGIN, completion, COMMIT, release) raise `StoreUnavailableError`; an error
 * the work throws goes to `onFailure` whatever it looks like.
 */
export class IdempotencyEngine<Tx> {
  constructor(private readonly store: IdempotencyStore<Tx>) {}

  async execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    const claimed = await this.claim(work);
    if (claimed.kind === 'replayed') return claimed;
    const held = claimed.held;
    let started = false;
    try {
      const { response, result } = await this.store.transaction(async (tx) => {
        started = true;
        const done = await work.run(tx, held.claim).catch((error: unknown) => Promise.reject(new WorkFailure(error)));
        // Fenced by the owner token inside the same transaction: if another
        // attempt took the key over, throwing here discards the work's writes.
        if (!(await this.store.complete(held.ref, done.response, work.ttlMs, tx))) throw new LeaseLostError();
        return done;
      });
      return { kind: 'executed', response, result };
    } catch (error) {
      if (error instanceof WorkFailure) return this.settleFailure(held, work, error.error, false);
      throw await this.storeFailure(held, error, started ? 'unknown' : 'not-run');
    }
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   */
  async executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    const claimed = await this.claim(work);
    if (claimed.kind === 'replayed') return claimed;
    const held = claimed.held;
    const phases = new Phases(this.store, held.ref, held.claim.generation, held.phases, work.leaseMs, work.enterPhase);
    let done: { response: StoredResponse; result: R };
    try {
      done = await work.run(phases, held.claim);
    } catch (error) {
      // Phases report their own store calls' failures as these two; anything else is the work's.
      if (error instanceof LeaseLostError || error instanceof StoreUnavailableError) throw error;
      return this.settleFailure(held, work, error, phases.hasProgress);
    }
    const completed = await this.guard(() => this.store.complete(held.ref, done.response, work.ttlMs), held);
    if (!completed) throw new LeaseLostError();
    return { kind: 'executed', ...done };
  }

  private async claim(
    work: WorkScope,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | { kind: 'claimed'; held: Held }> {
    const ref: ClaimRef = { tenant: work.tenant, key: work.key, ownerToken: randomUUID() };
    const claimedAt = Date.now();
    let claim;
    try {
      claim = await this.store.claim({ ...ref, fingerprint: work.fingerprint, leaseMs: work.leaseMs, ttlMs: work.ttlMs });
    } catch (error) {
      if (this.store.isUnavailableError(error)) throw new StoreUnavailableError(error, 'not-run');
      throw error;
    }
    switch (claim.state) {
      case 'completed':
        return { kind: 'replayed', response: claim.response };
      case 'in-flight':
        throw new KeyInFlightError(claim.retryAfterSeconds);
      case 'mismatch':
        throw new FingerprintMismatchError();
      case 'claimed':
        return {
          kind: 'claimed',
          held: {
            ref,
            claim: { attempt: claim.attempt, generation: claim.generation },
            phases: claim.phases,
            leaseEndsAt: claimedAt + work.leaseMs,
          },
        };
    }
  }

  /**
   * @param hasProgress phases of this key are committed: releasing the key
   *   would throw their recovery points away, so `release` keeps it instead.
   */
  private async settleFailure<R>(held: Held, work: WorkScope, error: unknown, hasProgress: boolean): Promise<EngineOutcome<R>> {
    const decision = await work.onFailure(error);
    switch (decision.action) {
      case 'store': {
        const stored = await this.guard(() => this.store.complete(held.ref, decision.response, work.ttlMs), held);
        if (!stored) throw new LeaseLostError();
        return { kind: 'failure-stored', response: decision.response, error };
      }
      case 'release':
        if (!hasProgress) await this.guard(() => this.store.release(held.ref), held);
        throw error;
      case 'keep':
        throw error;
    }
  }

  /**
   * What a failure of the store around the work means. Before the work
   * started (BEGIN failed) nothing ran: the claim is given back if the store
   * allows, so a retry need not wait out the lease. After it started, the
   * completion or COMMIT may or may not have happened, and the lease decides
   * what a retry finds.
   */
  private async storeFailure(held: Held, error: unknown, outcome: 'not-run' | 'unknown'): Promise<unknown> {
    if (error instanceof LeaseLostError || !this.store.isUnavailableError(error)) return error;
    if (outcome === 'not-run') {
      const released = await this.store.release(held.ref).catch(() => false);
      return new StoreUnavailableError(error, 'not-run', released ? undefined : secondsUntil(held.leaseEndsAt));
    }
    return new StoreUnavailableError(error, 'unknown', secondsUntil(held.leaseEndsAt));
  }

  /** Runs a store call made after the work started, turning "cannot reach the store" into an unknown outcome. */
  private async guard<T>(step: () => Promise<T>, held: Held): Promise<T> {
    try {
      return await step();
    } catch (error) {
      if (this.store.isUnavailableError(error)) throw new StoreUnavailableError(error, 'unknown', secondsUntil(held.leaseEndsAt));
      throw error;
    }
  }
}

function secondsUntil(at: number): number {
  return Math.max(1, Math.ceil((at - Date.now()) / 1000));
}
