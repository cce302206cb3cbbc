import { randomUUID } from 'node:crypto';
import type { ClaimRequest, ClaimResult, IdempotencyStore, StoredResponse } from './idempotency-store.js';
import type { Claimed, Held, LocalExecution } from './held.js';
import { limitHold } from './hold-limit.js';
import { renewLease } from './lease-renewal.js';
import type { ClaimInfo, WorkScope } from './work.js';

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

/** The keys this process holds while their work runs: visible to duplicates here, kept alive, bounded by `maxHoldMs`. */
export class HeldKeys<Tx> {
  private readonly local = new Map<string, LocalExecution>();

  constructor(private readonly store: IdempotencyStore<Tx>) {}

  /** The running execution of `work`'s key in this process whose lease has not ended, if any. */
  running(work: Pick<WorkScope, 'tenant' | 'key'>): LocalExecution | undefined {
    const running = this.local.get(localId(work));
    // Past its lease (no heartbeat, or a stalled one) the store decides: it may let this attempt take over.
    return running && Date.now() < running.held.leaseEndsAt ? running : undefined;
  }

  /**
   * Holds `claimed` while its work runs: visible here, with the heartbeat (separate claims) or the hold limit.
   * Returns the settle function: a duplicate waiting here learns the outcome only through it, after the commit.
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
    // Nobody can take over an uncommitted request-transaction claim, nor a separate attempt whose transaction
    // holds the key's lock (OpenAttempt.holdsKeyLock): no lease to renew, but a hold of at most maxHold.
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

  /** An operator ended the lease of this process's attempt on `(tenant, key)`: its duplicates here ask the store. */
  forgetLease(tenant: string, key: string): void {
    const running = this.local.get(localId({ tenant, key }));
    if (running) running.held.leaseEndsAt = 0;
  }

  /** Renews the lease every third of it while the work runs (see lease-renewal.ts), for at most `maxHoldMs`. */
  private heartbeat(held: Held, work: WorkScope, onHoldExceeded: () => void): (() => void) | undefined {
    if (!this.store.renewLease) return undefined;
    const { leaseMs } = work;
    const holdEndsAt = held.leaseEndsAt - leaseMs + (work.maxHoldMs ?? leaseMs * 10);
    const timer = setInterval(
      () => renewLease(this.store, held, leaseMs, holdEndsAt, timer, onHoldExceeded),
      Math.max(20, Math.floor(leaseMs / 3)),
    );
    // A pending renewal must not keep a process alive that is otherwise done.
    timer.unref?.();
    return () => clearInterval(timer);
  }
}

/** Where a key's execution (or claim on its way) is found in this process. */
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
