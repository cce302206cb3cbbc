import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type {
  ClaimRef,
  ClaimRequest,
  ClaimResult,
  IdempotencyStore,
  PhaseState,
  StoredResponse,
} from './idempotency-store.js';
import {
  FingerprintMismatchError,
  IdempotencyError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
  WorkFailure,
} from './errors.js';
import { SILENT_OBSERVER, type EngineObserver, type IdempotencyOutcome } from './observer.js';
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
  /**
   * How long a duplicate may wait for the attempt in flight to finish, then
   * replay its response, instead of an immediate `KeyInFlightError`. 0 (the
   * default) does not wait.
   */
  waitMs?: number;
  /** Renew the lease while the work runs, so a slow but live attempt is never taken over. */
  heartbeat?: boolean;
  /**
   * `'separate'` (default): the claim commits on its own before the work's
   * transaction. `'request-transaction'`: the claim is the first statement of
   * the work's transaction; a duplicate waits on its row lock (at most
   * `waitMs`), and a failure rolls the claim back with everything else.
   */
  claimMode?: ClaimMode;
  /** Names the work in spans, metrics and events (e.g. the controller method); never the key. */
  label?: string;
}

export type ClaimMode = 'separate' | 'request-transaction';

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

type Claimed = { kind: 'replayed'; response: StoredResponse } | { kind: 'claimed'; held: Held };

/**
 * An execution running in this process. A duplicate arriving here is
 * answered from it without a round trip: 422 for another fingerprint, 409,
 * or (when it may wait) the response once it is stored.
 */
interface LocalExecution {
  fingerprint: string;
  held: Held;
  /** The stored response once committed; undefined when the execution ended without one. */
  settled: Promise<StoredResponse | undefined>;
}

/** What an execution learnt on its way, for its outcome event. */
interface Trace {
  attempt?: number;
  failure?: 'released' | 'kept';
}

/** Longest pause between two looks at a key in flight elsewhere, while a duplicate waits for it. */
const MAX_WAIT_PAUSE_MS = 250;

/**
 * The state table (see the README) in one place, with no knowledge of HTTP or
 * Nest: claim (committed alone, or first in the work's transaction), run the
 * work and the fenced completion in one transaction, and settle the claim
 * when the work fails.
 *
 * Whose failure it is decides the answer. Only the store's own calls (claim,
 * BEGIN, completion, COMMIT, release) raise `StoreUnavailableError`; an error
 * the work throws goes to `onFailure` whatever it looks like.
 */
export class IdempotencyEngine<Tx> {
  private readonly local = new Map<string, LocalExecution>();

  /** What each running execution has learnt so far, for its outcome event. */
  private readonly traces = new WeakMap<WorkScope, Trace>();

  constructor(
    private readonly store: IdempotencyStore<Tx>,
    private readonly observer: EngineObserver = SILENT_OBSERVER,
  ) {}

  execute<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    return this.observe(work, async () => {
      if (work.claimMode === 'request-transaction') return this.executeInTransaction(work);
      const claimed = await this.claim(work);
      if (claimed.kind === 'replayed') return claimed;
      return this.holding(work, claimed.held, () => this.runClaimed(work, claimed.held));
    });
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   */
  executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    return this.observe(work, async () => {
      const claimed = await this.claim(work);
      if (claimed.kind === 'replayed') return claimed;
      return this.holding(work, claimed.held, () => this.runPhased(work, claimed.held));
    });
  }

  /**
   * One span around the execution, and one outcome event when it ends. The
   * span and the event name the route and the attempt, never the key, the
   * tenant or the body.
   */
  private observe<R>(work: WorkScope, run: () => Promise<EngineOutcome<R>>): Promise<EngineOutcome<R>> {
    const route = work.label ?? 'execute';
    return this.observer.span('idempotency.execute', { 'idempotency.route': route }, async (annotate) => {
      const trace: Trace = {};
      this.traces.set(work, trace);
      const started = performance.now();
      let outcome: IdempotencyOutcome = 'error';
      try {
        const result = await run();
        if (result.kind === 'executed') outcome = (trace.attempt ?? 1) > 1 ? 'takeover' : 'executed';
        else outcome = result.kind;
        return result;
      } catch (error) {
        outcome = trace.failure ?? outcomeOf(error);
        throw error;
      } finally {
        annotate({ 'idempotency.outcome': outcome, ...(trace.attempt ? { 'idempotency.attempt': trace.attempt } : {}) });
        this.observer.emit({ type: 'outcome', outcome, route, attempt: trace.attempt, durationMs: performance.now() - started });
      }
    });
  }

  /** A store's claim, in a span of its own, with a claim event. */
  private async observedClaim(work: WorkScope, claim: () => Promise<ClaimResult>): Promise<ClaimResult> {
    const started = performance.now();
    let state: ClaimResult['state'] | 'failed' = 'failed';
    try {
      return await this.observer.span('idempotency.claim', {}, async (annotate) => {
        const result = await claim();
        state = result.state;
        annotate({ 'idempotency.claim.state': result.state });
        return result;
      });
    } finally {
      this.observer.emit({ type: 'claim', state, route: work.label ?? 'execute', durationMs: performance.now() - started });
    }
  }

  /** A store's completion, in a span of its own. */
  private observedComplete(complete: () => Promise<boolean>): Promise<boolean> {
    return this.observer.span('idempotency.complete', {}, async (annotate) => {
      const completed = await complete();
      annotate({ 'idempotency.completed': completed });
      return completed;
    });
  }

  private async runClaimed<R>(work: IdempotentWork<Tx, R>, held: Held): Promise<EngineOutcome<R>> {
    let started = false;
    try {
      const { response, result } = await this.store.transaction(async (tx) => {
        started = true;
        const done = await work.run(tx, held.claim).catch((error: unknown) => Promise.reject(new WorkFailure(error)));
        // Fenced by the owner token inside the same transaction: if another
        // attempt took the key over, throwing here discards the work's writes.
        if (!(await this.observedComplete(() => this.store.complete(held.ref, done.response, work.ttlMs, tx))))
          throw new LeaseLostError();
        return done;
      });
      return { kind: 'executed', response, result };
    } catch (error) {
      if (error instanceof WorkFailure) return this.settleFailure(held, work, error.error, false);
      throw await this.storeFailure(held, error, started ? 'unknown' : 'not-run');
    }
  }

  private async runPhased<R>(work: PhasedWork<Tx, R>, held: Held): Promise<EngineOutcome<R>> {
    const phases = new Phases(this.store, held.ref, held.claim.generation, held.phases, work.leaseMs, work.enterPhase);
    let done: { response: StoredResponse; result: R };
    try {
      done = await work.run(phases, held.claim);
    } catch (error) {
      // Phases report their own store calls' failures as these two; anything else is the work's.
      if (error instanceof LeaseLostError || error instanceof StoreUnavailableError) throw error;
      return this.settleFailure(held, work, error, phases.hasProgress);
    }
    const completed = await this.guard(
      () => this.observedComplete(() => this.store.complete(held.ref, done.response, work.ttlMs)),
      held,
    );
    if (!completed) throw new LeaseLostError();
    return { kind: 'executed', ...done };
  }

  /**
   * The claim mode `request-transaction`: BEGIN, claim, work, completion,
   * COMMIT, one commit per new key. Nothing is visible to others until the
   * commit; a concurrent duplicate waits on the claimed row's lock (at most
   * `waitMs`), then replays what committed or gets a 409. A failure rolls the
   * claim back with the work's writes, so the key is free again at once,
   * unless the policy stores the failure's response, which is then claimed
   * and completed on its own.
   */
  private async executeInTransaction<R>(work: IdempotentWork<Tx, R>): Promise<EngineOutcome<R>> {
    const early = await this.answerLocally(work, Date.now() + (work.waitMs ?? 0));
    if (early) return early;
    let started = false;
    try {
      return await this.store.transaction(async (tx): Promise<EngineOutcome<R>> => {
        started = true;
        const request = this.request(work);
        const claimed = this.interpret(
          work,
          request,
          await this.observedClaim(work, () => this.store.claim(request, tx, work.waitMs ?? 0)),
        );
        if (claimed.kind === 'replayed') return claimed;
        const held = claimed.held;
        // No heartbeat: nobody else can see, let alone take over, an uncommitted claim.
        return this.holding({ ...work, heartbeat: false }, held, async () => {
          const done = await work.run(tx, held.claim).catch((error: unknown) => Promise.reject(new WorkFailure(error)));
          if (!(await this.observedComplete(() => this.store.complete(held.ref, done.response, work.ttlMs, tx))))
            throw new LeaseLostError();
          return { kind: 'executed', ...done };
        });
      });
    } catch (error) {
      if (error instanceof WorkFailure) return this.settleRolledBack(work, error.error);
      if (!(error instanceof Error) || error instanceof IdempotencyError || !this.store.isUnavailableError(error)) throw error;
      // Nothing is held once the transaction is gone: a retry can run as soon as the store answers.
      throw new StoreUnavailableError(error, started ? 'unknown' : 'not-run');
    }
  }

  /** A failure in request-transaction mode: the claim rolled back with the work; only 'store' writes anything. */
  private async settleRolledBack<R>(work: WorkScope, error: unknown): Promise<EngineOutcome<R>> {
    const decision = await work.onFailure(error);
    const trace = this.traces.get(work);
    // The claim rolled back with the work: the key is free again either way.
    if (trace) trace.failure = 'released';
    if (decision.action !== 'store') throw error;
    const request = this.request(work);
    const claimed = await this.guardClaim(() => this.observedClaim(work, () => this.store.claim(request))).then((claim) =>
      this.interpret(work, request, claim),
    );
    // Another attempt got the key in between: its outcome stands, and this client still gets its own answer.
    if (claimed.kind === 'claimed')
      await this.guard(
        () => this.observedComplete(() => this.store.complete(claimed.held.ref, decision.response, work.ttlMs)),
        claimed.held,
      );
    return { kind: 'failure-stored', response: decision.response, error };
  }

  /**
   * Claims the key, or answers as the state table says. A duplicate of an
   * execution running in this process is answered without a round trip. With
   * `waitMs`, a duplicate of one in flight waits for it to finish and replays
   * its response, looking again at growing intervals (each look one short
   * statement on a pooled connection, none held while waiting) until the
   * time is up, then gets the 409.
   */
  private async claim(work: WorkScope): Promise<Claimed> {
    const deadline = Date.now() + (work.waitMs ?? 0);
    const early = await this.answerLocally(work, deadline);
    if (early) return early;
    for (let pause = 20; ; pause = Math.min(pause * 2, MAX_WAIT_PAUSE_MS)) {
      const request = this.request(work);
      try {
        return this.interpret(
          work,
          request,
          await this.guardClaim(() => this.observedClaim(work, () => this.store.claim(request))),
        );
      } catch (error) {
        const left = deadline - Date.now();
        if (!(error instanceof KeyInFlightError) || left <= 0) throw error;
        await sleep(Math.min(pause, left, error.retryAfterSeconds * 1000));
      }
    }
  }

  /**
   * The answer for a duplicate of an execution running in this process:
   * 422 for another fingerprint; without a wait, 409; with one, its stored
   * response once committed. Undefined when none runs here, or it ended
   * without a response, or the wait ran out (then the store decides).
   */
  private async answerLocally(
    work: WorkScope,
    deadline: number,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | undefined> {
    const running = this.local.get(localId(work));
    // Past its lease (no heartbeat, or a stalled one) the store decides: it may let this attempt take over.
    if (!running || Date.now() >= running.held.leaseEndsAt) return undefined;
    if (running.fingerprint !== work.fingerprint) throw new FingerprintMismatchError();
    if (!work.waitMs) throw new KeyInFlightError(secondsUntil(running.held.leaseEndsAt));
    const timeout = new AbortController();
    const response = await Promise.race([
      running.settled,
      sleep(Math.max(0, deadline - Date.now()), undefined, { signal: timeout.signal }).catch(() => undefined),
    ]);
    timeout.abort();
    return response ? { kind: 'replayed', response } : undefined;
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

  private interpret(work: WorkScope, request: ClaimRequest, claim: ClaimResult): Claimed {
    switch (claim.state) {
      case 'completed':
        return { kind: 'replayed', response: claim.response };
      case 'in-flight':
        throw new KeyInFlightError(claim.retryAfterSeconds);
      case 'mismatch':
        throw new FingerprintMismatchError();
      case 'claimed': {
        const trace = this.traces.get(work);
        if (trace) trace.attempt = claim.attempt;
        return {
          kind: 'claimed',
          held: {
            ref: { tenant: request.tenant, key: request.key, ownerToken: request.ownerToken },
            claim: { attempt: claim.attempt, generation: claim.generation },
            phases: claim.phases,
            leaseEndsAt: Date.now() + work.leaseMs,
          },
        };
      }
    }
  }

  /**
   * Runs an execution that holds its claim: visible to duplicates in this
   * process while it runs, and with `heartbeat`, renewing its lease.
   */
  private async holding<R>(work: WorkScope, held: Held, run: () => Promise<EngineOutcome<R>>): Promise<EngineOutcome<R>> {
    const id = localId(work);
    let settle!: (response: StoredResponse | undefined) => void;
    const running: LocalExecution = {
      fingerprint: work.fingerprint,
      held,
      settled: new Promise((resolve) => (settle = resolve)),
    };
    this.local.set(id, running);
    const stopHeartbeat = work.heartbeat ? this.heartbeat(held, work.leaseMs) : undefined;
    try {
      const outcome = await run();
      settle(outcome.response);
      return outcome;
    } catch (error) {
      settle(undefined);
      throw error;
    } finally {
      stopHeartbeat?.();
      if (this.local.get(id) === running) this.local.delete(id);
    }
  }

  /**
   * Renews the lease every third of it while the work runs. A renewal that
   * finds the key no longer this attempt's stops the beat; one that cannot
   * reach the store is tried again at the next beat: the lease decides.
   */
  private heartbeat(held: Held, leaseMs: number): () => void {
    if (!this.store.renewLease) return () => undefined;
    const timer = setInterval(
      () => {
        const sentAt = Date.now();
        this.store.renewLease!(held.ref, leaseMs).then(
          (ours) => {
            if (ours) held.leaseEndsAt = sentAt + leaseMs;
            else clearInterval(timer);
          },
          () => undefined,
        );
      },
      Math.max(20, Math.floor(leaseMs / 3)),
    );
    // A pending renewal must not keep a process alive that is otherwise done.
    timer.unref?.();
    return () => clearInterval(timer);
  }

  private async guardClaim(claim: () => Promise<ClaimResult>): Promise<ClaimResult> {
    try {
      return await claim();
    } catch (error) {
      if (this.store.isUnavailableError(error)) throw new StoreUnavailableError(error, 'not-run');
      throw error;
    }
  }

  /**
   * @param hasProgress phases of this key are committed: releasing the key
   *   would throw their recovery points away, so `release` keeps it instead.
   */
  private async settleFailure<R>(held: Held, work: WorkScope, error: unknown, hasProgress: boolean): Promise<EngineOutcome<R>> {
    const decision = await work.onFailure(error);
    const trace = this.traces.get(work);
    if (trace && decision.action !== 'store') trace.failure = decision.action === 'release' && !hasProgress ? 'released' : 'kept';
    switch (decision.action) {
      case 'store': {
        const stored = await this.guard(
          () => this.observedComplete(() => this.store.complete(held.ref, decision.response, work.ttlMs)),
          held,
        );
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

function outcomeOf(error: unknown): IdempotencyOutcome {
  if (error instanceof KeyInFlightError) return 'conflict';
  if (error instanceof FingerprintMismatchError) return 'mismatch';
  if (error instanceof LeaseLostError) return 'lease-lost';
  if (error instanceof StoreUnavailableError) return 'unavailable';
  return 'error';
}

/** Where a key's execution is found in this process. */
function localId(work: WorkScope): string {
  return `${work.tenant.length}:${work.tenant}:${work.key}`;
}

function secondsUntil(at: number): number {
  return Math.max(1, Math.ceil((at - Date.now()) / 1000));
}
