import type { ClaimRef, OpenAttempt, PhaseState, StoredResponse } from './idempotency-store.js';
import type { ClaimInfo } from './work.js';

/** A claim this attempt holds, and until when (by this process's clock: only for `Retry-After` hints). */
export interface Held {
  ref: ClaimRef;
  claim: ClaimInfo;
  phases: PhaseState;
  leaseEndsAt: number;
}

/** An attempt that owns its key. `transaction` is the work's open one, absent for phased work (each phase opens its own). */
export interface Claimed<Tx> {
  mode: 'separate' | 'request-transaction';
  held: Held;
  transaction?: OpenAttempt<Tx>;
  /** The attempt held its key past `maxHoldMs` and was ended: it lost its key. */
  holdExceeded?: boolean;
}

/** An execution running in this process, which answers its duplicates arriving here without a round trip. */
export interface LocalExecution {
  fingerprint: string;
  held: Held;
  /** The stored response once committed; undefined when the execution ended without one. */
  settled: Promise<StoredResponse | undefined>;
}

/** Seconds until `held`'s lease ends, at least one: a `Retry-After` hint. */
export function leaseSecondsLeft(held: Held): number {
  return Math.max(1, Math.ceil((held.leaseEndsAt - Date.now()) / 1000));
}
