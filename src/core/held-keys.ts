import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type {
  ClaimRef,
  ClaimRequest,
  ClaimResult,
  IdempotencyStore,
  OpenAttempt,
  PhaseState,
  StoredResponse,
} from './idempotency-store.js';
import { limitHold } from './hold-limit.js';
import type { ClaimInfo, WorkScope } from './work.js';

/** A claim this attempt holds, and until when (by this process's clock: only for `Retry-After` hints). */
export interface Held {
  ref: ClaimRef;
  claim: ClaimInfo;
  phases: PhaseState;
  leaseEndsAt: number;
}

/** A claim of `work`'s key by a new attempt, with an owner token of its own. */
export function claimRequest(work: WorkScope): ClaimRequest {
  return {
    tenant: work.tenant,
    key: work.key,
    ownerToken: randomUUID(),
    fingerprint: work.fingerprint,
    leaseMs: work.leaseMs,
    ttlMs: work.ttlMs,
  };
}

/** What an attempt holds once `request` claimed its key. */
export function heldBy(work: WorkScope, request: ClaimRequest, claim: Extract<ClaimResult, { state: 'claimed' }>): Held {
  const info: ClaimInfo = { attempt: claim.attempt, generation: claim.generation };
  return {
    ref: { tenant: request.tenant, key: request.key, ownerToken: request.ownerToken },
    claim: info,
    phases: claim.phases,
    leaseEndsAt: Date.now() + work.leaseMs,
  };
}

/** Seconds until `held`'s lease ends, at least one: a `Retry-After` hint. */
export function leaseSecondsLeft(held: Held): number {
  return Math.max(1, Math.ceil((held.leaseEndsAt - Date.now()) / 1000));
}

/** An attempt that owns its key. `transaction` is the work's open one, absent for phased work (each phase opens its own). */
export interface Claimed<Tx> {
  mode: 'separate' | 'request-transaction';
  held: Held;
  transaction?: OpenAttempt<Tx>;
  /** The attempt held its key past `maxHoldMs` and was ended: it lost its key. */
  holdExceeded?: boolean;
}

/**
 * An execution running in this process. A duplicate arriving here is
 * answered from it without a round trip: 422 for another fingerprint, 409,
 * or (when it may wait) the response once it is committed.
 */
export interface LocalExecution {
  fingerprint: string;
  held: Held;
  /** The stored response once committed; undefined when the execution ended without one. */
  settled: Promise<StoredResponse | undefined>;
}

/**
 * The keys this process holds while their work runs: visible to duplicates
 * arriving here, kept alive by the heartbeat, and bounded by `maxHoldMs`.
 */
export class HeldKeys<Tx> {
  private readonly local = new Map<string, LocalExecution>();

  constructor(private readonly store: IdempotencyStore<Tx>) {}

  /**
   * The running execution of `work`'s key in this process whose lease has
   * not ended, if any: its fingerprint, and its response once settled.
   */
  running(work: Pick<WorkScope, 'tenant' | 'key'>): LocalExecution | undefined {
    const running = this.local.get(localId(work));
    // Past its lease (no heartbeat, or a stalled one) the store decides: it may let this attempt take over.
    return running && Date.now() < running.held.leaseEndsAt ? running : undefined;
  }

  /** Waits for `running` to settle until `deadline`; undefined when it ended without a response or time ran out. */
  async settled(running: LocalExecution, deadline: number): Promise<StoredResponse | undefined> {
    const timeout = new AbortController();
    const response = await Promise.race([
      running.settled,
      sleep(Math.max(0, deadline - Date.now()), undefined, { signal: timeout.signal }).catch(() => undefined),
    ]);
    timeout.abort();
    return response;
  }

  /**
   * Starts holding `claimed` while its work runs: visible here, with the
   * heartbeat (separate claims) or the hold limit (an attempt nobody can take
   * over: see `hold-limit.ts`). Returns the settle function: a duplicate waiting here learns the
   * outcome only through it, after the commit.
   */
  hold(work: WorkScope, claimed: Claimed<Tx>): (response: StoredResponse | undefined) => void {
    const id = localId(work);
    let settle!: (response: StoredResponse | undefined) => void;
    const running: LocalExecution = {
      fingerprint: work.fingerprint,
      held: claimed.held,
      settled: new Promise((resolve) => (settle = resolve)),
    };
    this.local.set(id, running);
    // In request-transaction mode nobody else can see, let alone take over, an uncommitted claim: no lease to renew,
    // but the attempt still holds its key (the lock its transaction took) for at most maxHold. So does a separate
    // attempt whose transaction holds the key's lock (see OpenAttempt.holdsKeyLock).
    const warnOnce = once(work.onHoldExceeded);
    const stopHeartbeat =
      claimed.mode === 'separate' && work.heartbeat ? this.heartbeat(claimed.held, work, warnOnce) : undefined;
    const stopHoldLimit =
      claimed.mode === 'request-transaction' || claimed.transaction?.holdsKeyLock
        ? limitHold(claimed, work, warnOnce)
        : undefined;
    return (response) => {
      stopHeartbeat?.();
      stopHoldLimit?.();
      if (this.local.get(id) === running) this.local.delete(id);
      settle(response);
    };
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
  private heartbeat(held: Held, work: WorkScope, onHoldExceeded: () => void): (() => void) | undefined {
    if (!this.store.renewLease) return undefined;
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
}

/** Where a key's execution (or claim on its way: see claims-on-their-way.ts) is found in this process. */
export function localId(work: Pick<WorkScope, 'tenant' | 'key'>): string {
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
