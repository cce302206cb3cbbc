import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type {
  BeginResult,
  ClaimMode,
  ClaimRef,
  ClaimRequest,
  ClaimResult,
  IdempotencyStore,
  OpenAttempt,
  PhaseState,
  StoredResponse,
} from './idempotency-store.js';
import { beginAttempt } from './begin-attempt.js';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  IdempotencyError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './errors.js';
import { SILENT_OBSERVER, type EngineObserver, type IdempotencyOutcome } from './observer.js';
import { Phases, type TransactionOutcome } from './phases.js';

export type { ClaimMode } from './idempotency-store.js';

/**
 * What to do with the claim when the work throws (see "Handler outcomes" in the README).
 * - `store`: a definite outcome; the work's writes roll back and `response`
 *   is stored and replayed like a success.
 * - `release`: nothing took effect; give the claim back so a retry runs at once
 *   (`forget`: delete it whatever it carries; see `IdempotencyStore.release`).
 * - `keep`: unknown outcome; leave the claim in flight until its lease ends.
 */
export type FailureDecision =
  { action: 'store'; response: StoredResponse } | { action: 'release'; forget?: boolean } | { action: 'keep' };

/** What identifies one idempotent unit of work, and how long it may hold and keep its key. */
export interface WorkScope {
  tenant: string;
  key: string;
  fingerprint: string;
  leaseMs: number;
  ttlMs: number;
  /**
   * Classifies an error thrown by the work, or a `CommitRefusedError` when
   * the database refused to commit it (never a failure to reach the store),
   * once the work's writes have rolled back. May wait, e.g. for the response
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
   * The longest the heartbeat keeps the key, from the claim: then it stops,
   * the lease runs out and the attempt can be taken over (and fenced) like
   * a dead one. Default ten leases.
   */
  maxHoldMs?: number;
  /** Told once when the heartbeat stops at `maxHoldMs`. */
  onHoldExceeded?: () => void;
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

/**
 * Every field of `WorkScope`: the compiler refuses this record when a field is
 * added to the scope and not here, so `workOf` (which copies these) cannot
 * silently drop one.
 */
export const WORK_SCOPE_FIELDS: Readonly<Record<keyof WorkScope, true>> = {
  tenant: true,
  key: true,
  fingerprint: true,
  leaseMs: true,
  ttlMs: true,
  onFailure: true,
  waitMs: true,
  heartbeat: true,
  maxHoldMs: true,
  onHoldExceeded: true,
  claimMode: true,
  label: true,
};

/**
 * `scope` with its `run`, as one object literal, field by field. An object
 * spread followed by more properties (`{ ...scope, run }`) makes V8 (Node 20)
 * build each copy through a slow path, about a microsecond per added
 * property, and every request copies its scope at each layer (entry point,
 * service, engine): written out, a copy costs nanoseconds.
 */
export function workOf<Run>(scope: WorkScope, run: Run): WorkScope & { run: Run } {
  return {
    tenant: scope.tenant,
    key: scope.key,
    fingerprint: scope.fingerprint,
    leaseMs: scope.leaseMs,
    ttlMs: scope.ttlMs,
    onFailure: scope.onFailure,
    waitMs: scope.waitMs,
    heartbeat: scope.heartbeat,
    maxHoldMs: scope.maxHoldMs,
    onHoldExceeded: scope.onHoldExceeded,
    claimMode: scope.claimMode,
    label: scope.label,
    run,
  };
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
  /**
   * Wraps each phase's work, e.g. to expose its transaction through
   * AsyncLocalStorage; `ended` settles once the phase's transaction has ended.
   */
  enterPhase?: <T>(tx: Tx, fn: () => Promise<T>, ended: Promise<TransactionOutcome>) => Promise<T>;
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
 * An attempt that owns its key: what the two kinds of work share. `attempt`
 * is the work's open transaction, absent for phased work (each phase opens
 * its own).
 */
interface Claimed<Tx> {
  mode: ClaimMode;
  held: Held;
  attempt?: OpenAttempt<Tx>;
  /** The attempt held its key past `maxHoldMs` and was ended (request-transaction mode): it lost its key. */
  holdExceeded?: boolean;
}

/**
 * An execution running in this process. A duplicate arriving here is
 * answered from it without a round trip: 422 for another fingerprint, 409,
 * or (when it may wait) the response once it is committed.
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
 * Nest. Every execution follows one lifecycle, whatever its claim mode:
 *
 * 1. answer a duplicate of an execution running in this process from it;
 * 2. claim the key and open the work's transaction (`store.begin`: the claim
 *    commits alone first, or is the transaction's first statement);
 * 3. run the work;
 * 4. complete the key, fenced by the owner token, and COMMIT with the work;
 * 5. settle: only now, after the commit, may anyone (a waiting duplicate,
 *    the caller) see the outcome.
 *
 * A failure of the work, or a COMMIT the database refuses (its writes did
 * not happen either), rolls the work back and is classified once, by
 * `onFailure`. Only the store's own calls failing to reach the database
 * raise `StoreUnavailableError`.
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
    return this.observe(work, () =>
      this.attempt(work, work.claimMode ?? 'separate', true, (claimed) => this.runInTransaction(work, claimed)),
    );
  }

  /**
   * Like `execute`, for work written as phases (see `Phases`): a takeover
   * resumes after the last recorded phase instead of starting at the top.
   * Always claimed separately: each phase commits on its own.
   */
  executePhased<R>(work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
    return this.observe(work, () => this.attempt(work, 'separate', false, (claimed) => this.runPhases(work, claimed)));
  }

  /** The lifecycle: steps 1 and 2 here, 3 and 4 in `run`, 5 in `holding` once `run` has settled. */
  private async attempt<R>(
    work: WorkScope,
    mode: ClaimMode,
    opensTransaction: boolean,
    run: (claimed: Claimed<Tx>) => Promise<EngineOutcome<R>>,
  ): Promise<EngineOutcome<R>> {
    const deadline = Date.now() + (work.waitMs ?? 0);
    const answered = await this.answerLocally(work, deadline);
    if (answered) return answered;
    const begun = await this.begin(work, mode, opensTransaction, deadline);
    if (begun.kind === 'replayed') return begun;
    return this.holding(work, begun, () => run(begun));
  }

  /** Steps 3 and 4 for work in one transaction. */
  private async runInTransaction<R>(work: IdempotentWork<Tx, R>, claimed: Claimed<Tx>): Promise<EngineOutcome<R>> {
    const attempt = claimed.attempt!;
    let done: { response: StoredResponse; result: R };
    try {
      done = await work.run(attempt.tx, claimed.held.claim);
    } catch (error) {
      // Ended at maxHold, the work failed because its transaction was taken from it: not an outcome of its own.
      if (claimed.holdExceeded) throw new LeaseLostError();
      return this.fail(work, claimed, error);
    }
    let completed: boolean;
    try {
      completed = await this.observedComplete(() => attempt.commit(done.response, work.ttlMs));
    } catch (error) {
      if (this.store.isUnavailableError(error)) throw this.outcomeUnknown(error, claimed);
      // The database answered, and no: the work's writes did not happen, which is the work's failure.
      return this.fail(work, { ...claimed, attempt: undefined }, new CommitRefusedError(error));
    }
    if (!completed) throw new LeaseLostError();
    return { kind: 'executed', ...done };
  }

  /** Steps 3 and 4 for phased work: each phase commits itself; the completion commits on its own. */
  private async runPhases<R>(work: PhasedWork<Tx, R>, claimed: Claimed<Tx>): Promise<EngineOutcome<R>> {
    const { held } = claimed;
    const phases = new Phases(this.store, held.ref, held.claim.generation, held.phases, work.leaseMs, work.enterPhase);
    let done: { response: StoredResponse; result: R };
    try {
      done = await work.run(phases, held.claim);
    } catch (error) {
      // Phases report their own store calls' failures as these two; anything else is the work's.
      if (error instanceof LeaseLostError || error instanceof StoreUnavailableError) throw error;
      return this.fail(work, claimed, error, phases.hasProgress);
    }
    const completed = await this.guard(
      () => this.observedComplete(() => this.store.complete(held.ref, done.response, work.ttlMs)),
      claimed,
    );
    if (!completed) throw new LeaseLostError();
    return { kind: 'executed', ...done };
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
  private async fail<R>(work: WorkScope, claimed: Claimed<Tx>, error: unknown, hasProgress = false): Promise<EngineOutcome<R>> {
    const { mode, held, attempt } = claimed;
    const claimKept = attempt ? await this.guard(() => attempt.rollback(mode === 'request-transaction'), claimed) : false;
    let decision: FailureDecision;
    try {
      decision = await work.onFailure(error);
    } catch (classifying) {
      if (claimKept) await attempt!.rollback(false).catch(() => undefined);
      throw classifying;
    }
    const trace = this.traces.get(work);
    if (decision.action === 'store') {
      const response = decision.response;
      let stored: boolean;
      if (claimKept) stored = await this.guard(() => this.observedComplete(() => attempt!.commit(response, work.ttlMs)), claimed);
      else if (mode === 'separate')
        stored = await this.guard(
          () => this.observedComplete(() => this.store.complete(held.ref, response, work.ttlMs)),
          claimed,
        );
      else stored = await this.storeAnew(work, response);
      // In request-transaction mode a lost race only means another attempt's outcome stands; this client still gets its own.
      if (!stored && mode === 'separate') throw new LeaseLostError();
      return { kind: 'failure-stored', response, error };
    }
    if (claimKept) await this.guard(() => attempt!.rollback(false), claimed);
    if (mode === 'request-transaction') {
      // The claim rolled back with the work: the key is free again either way.
      if (trace) trace.failure = 'released';
    } else if (decision.action === 'release' && !hasProgress) {
      await this.guard(() => this.store.release(held.ref, decision.forget), claimed);
      if (trace) trace.failure = 'released';
    } else if (trace) trace.failure = 'kept';
    throw error;
  }

  /**
   * A failure's response to store in `request-transaction` mode once its
   * transaction is gone (its COMMIT was refused): claimed and completed on
   * its own. False when another attempt got the key in between.
   */
  private async storeAnew(work: WorkScope, response: StoredResponse): Promise<boolean> {
    const request = this.request(work);
    const claim = await this.observedClaim(work, () => this.store.claim(request).then((c) => ({ claim: c })));
    if (claim.claim.state !== 'claimed') return false;
    const held = this.held(work, request, claim.claim);
    return this.guard(() => this.observedComplete(() => this.store.complete(held.ref, response, work.ttlMs)), {
      mode: 'separate',
      held,
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
        this.observer.emit(
          { type: 'outcome', outcome, route, attempt: trace.attempt, durationMs: performance.now() - started },
          work.tenant,
        );
      }
    });
  }

  /**
   * A store's claim (and BEGIN), in a span of its own, with a claim event. A
   * store that cannot be reached means the work never ran.
   */
  private async observedClaim<T extends { claim: ClaimResult }>(work: WorkScope, claim: () => Promise<T>): Promise<T> {
    const started = performance.now();
    let state: ClaimResult['state'] | 'failed' = 'failed';
    try {
      return await this.observer.span('idempotency.claim', {}, async (annotate) => {
        const result = await claim();
        state = result.claim.state;
        annotate({ 'idempotency.claim.state': state });
        return result;
      });
    } catch (error) {
      if (!(error instanceof IdempotencyError) && this.store.isUnavailableError(error))
        throw new StoreUnavailableError(error, 'not-run');
      throw error;
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

  /**
   * Step 2: claims the key (and opens the work's transaction), or answers as
   * the state table says. With `waitMs`, a duplicate of an attempt in flight
   * elsewhere waits for it: in `request-transaction` mode on the claimed
   * row's lock; otherwise looking again at growing intervals (each look one
   * short statement, no connection held while waiting) until the time is up,
   * then it gets the 409.
   */
  private async begin(
    work: WorkScope,
    mode: ClaimMode,
    opensTransaction: boolean,
    deadline: number,
  ): Promise<{ kind: 'replayed'; response: StoredResponse } | ({ kind: 'claimed' } & Claimed<Tx>)> {
    for (let pause = 20; ; pause = Math.min(pause * 2, MAX_WAIT_PAUSE_MS)) {
      const request = this.request(work);
      const begun = await this.observedClaim(work, (): Promise<BeginResult<Tx>> =>
        opensTransaction
          ? this.store.begin
            ? this.store.begin(request, mode, work.waitMs ?? 0)
            : beginAttempt(this.store, request, mode, work.waitMs ?? 0)
          : this.store.claim(request).then((claim) => ({ claim }) as BeginResult<Tx>),
      );
      const { claim } = begun;
      switch (claim.state) {
        case 'completed':
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
          return { kind: 'claimed', mode, held: this.held(work, request, claim), attempt: begun.attempt };
      }
    }
  }

  /**
   * Step 1: the answer for a duplicate of an execution running in this
   * process: 422 for another fingerprint; without a wait, 409; with one, its
   * stored response once committed. Undefined when none runs here, or it
   * ended without a response, or the wait ran out (then the store decides).
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

  private held(work: WorkScope, request: ClaimRequest, claim: Extract<ClaimResult, { state: 'claimed' }>): Held {
    const trace = this.traces.get(work);
    if (trace) trace.attempt = claim.attempt;
    return {
      ref: { tenant: request.tenant, key: request.key, ownerToken: request.ownerToken },
      claim: { attempt: claim.attempt, generation: claim.generation },
      phases: claim.phases,
      leaseEndsAt: Date.now() + work.leaseMs,
    };
  }

  /**
   * Runs an execution that holds its claim: visible to duplicates in this
   * process while it runs and, with `heartbeat`, renewing its lease. Step 5
   * is here, in one place: a duplicate waiting in this process learns the
   * outcome only once `run` has returned, that is after the commit.
   */
  private async holding<R>(
    work: WorkScope,
    claimed: Claimed<Tx>,
    run: () => Promise<EngineOutcome<R>>,
  ): Promise<EngineOutcome<R>> {
    const id = localId(work);
    let settle!: (response: StoredResponse | undefined) => void;
    const running: LocalExecution = {
      fingerprint: work.fingerprint,
      held: claimed.held,
      settled: new Promise((resolve) => (settle = resolve)),
    };
    this.local.set(id, running);
    // In request-transaction mode nobody else can see, let alone take over, an uncommitted claim: no lease to renew,
    // but the attempt still holds its key (the lock its transaction took) for at most maxHold.
    // So does a separate attempt whose transaction holds the key's lock (see OpenAttempt.holdsKeyLock).
    const warnOnce = once(work.onHoldExceeded);
    const stopHeartbeat =
      claimed.mode === 'separate' && work.heartbeat ? this.heartbeat(claimed.held, work, warnOnce) : undefined;
    const stopHoldLimit =
      claimed.mode === 'request-transaction' || claimed.attempt?.holdsKeyLock
        ? this.holdLimit(claimed, work, warnOnce)
        : undefined;
    let response: StoredResponse | undefined;
    try {
      const outcome = await run();
      response = outcome.response;
      return outcome;
    } finally {
      stopHeartbeat?.();
      stopHoldLimit?.();
      if (this.local.get(id) === running) this.local.delete(id);
      settle(response);
    }
  }

  /**
   * Someone ended the lease of this process's attempt on `(tenant, key)` in
   * the store (an operator, through the board): its duplicates here ask the
   * store from now on, as they would once its heartbeat noticed.
   */
  forgetLease(tenant: string, key: string): void {
    const running = this.local.get(localId({ tenant, key }));
    if (running) running.held.leaseEndsAt = 0;
  }

  /**
   * Renews the lease every third of it while the work runs, for at most
   * `maxHoldMs` from the claim: a handler that hangs must not hold its key,
   * its transaction and a connection for ever. A renewal that finds the key
   * no longer this attempt's stops the beat; one that cannot reach the store
   * is tried again at the next beat: the lease decides.
   */
  private heartbeat(held: Held, work: WorkScope, onHoldExceeded: () => void): () => void {
    if (!this.store.renewLease) return () => undefined;
    const { leaseMs } = work;
    const holdEndsAt = held.leaseEndsAt - leaseMs + (work.maxHoldMs ?? leaseMs * 10);
    const timer = setInterval(
      () => {
        const sentAt = Date.now();
        if (sentAt + leaseMs > holdEndsAt) {
          clearInterval(timer);
          onHoldExceeded();
          return;
        }
        this.store.renewLease!(held.ref, leaseMs).then(
          (ours) => {
            if (ours) held.leaseEndsAt = sentAt + leaseMs;
            else {
              // Taken over, or released by an operator: this process's duplicates must ask the store from now on
              // (it lets them take the key over), not be answered 409 on the strength of a lease that is gone.
              held.leaseEndsAt = 0;
              clearInterval(timer);
            }
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

  /**
   * Bounds the hold on its key of an attempt nobody can take over (request-transaction mode, or a transaction that
   * holds the key's lock): at `maxHoldMs`
   * from the claim the store ends its transaction (rolled back, whatever the
   * work is doing), so a hung handler keeps neither its key nor its
   * connection, and the attempt answers 409 lease-lost.
   */
  private holdLimit(claimed: Claimed<Tx>, work: WorkScope, onHoldExceeded: () => void): (() => void) | undefined {
    const attempt = claimed.attempt;
    if (!attempt?.abort) return undefined;
    const timer = setTimeout(
      () => {
        claimed.holdExceeded = true;
        // This process's duplicates ask the store from now on: the key is free once the transaction has ended.
        claimed.held.leaseEndsAt = 0;
        onHoldExceeded();
        attempt.abort!().catch(() => undefined);
      },
      work.maxHoldMs ?? work.leaseMs * 10,
    );
    timer.unref?.();
    return () => clearTimeout(timer);
  }

  /** Runs a store call made after the work started, turning "cannot reach the store" into an unknown outcome. */
  private async guard<T>(step: () => Promise<T>, claimed: Claimed<Tx>): Promise<T> {
    try {
      return await step();
    } catch (error) {
      if (!(error instanceof IdempotencyError) && this.store.isUnavailableError(error)) throw this.outcomeUnknown(error, claimed);
      throw error;
    }
  }

  /**
   * The store was lost after the work started. With a separate claim, the
   * claim is still held until its lease ends (whatever happened to the
   * COMMIT); in `request-transaction` mode nothing is held once the
   * transaction is gone, so a retry can run as soon as the store answers.
   */
  private outcomeUnknown(error: unknown, claimed: Claimed<Tx>): StoreUnavailableError {
    const retryAfter = claimed.mode === 'separate' ? secondsUntil(claimed.held.leaseEndsAt) : undefined;
    return new StoreUnavailableError(error, 'unknown', retryAfter);
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
function localId(work: Pick<WorkScope, 'tenant' | 'key'>): string {
  return `${work.tenant.length}:${work.tenant}:${work.key}`;
}

/** `fn` called at most once (and nothing when absent). */
function once(fn: (() => void) | undefined): () => void {
  let called = false;
  return () => {
    if (called) return;
    called = true;
    fn?.();
  };
}

function secondsUntil(at: number): number {
  return Math.max(1, Math.ceil((at - Date.now()) / 1000));
}
