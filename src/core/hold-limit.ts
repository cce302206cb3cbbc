import type { Claimed } from './held.js';
import type { WorkScope } from './work.js';

/**
 * Bounds the hold on its key of an attempt nobody can take over: at
 * `maxHoldMs` from the claim the store ends its transaction (rolled back,
 * whatever the work is doing), so a hung handler keeps neither its key nor
 * its connection, and the attempt answers 409 lease-lost.
 */
export function limitHold<Tx>(claimed: Claimed<Tx>, work: WorkScope, onHoldExceeded: () => void): (() => void) | undefined {
  const transaction = claimed.transaction;
  if (!transaction?.abort) return undefined;
  const timer = setTimeout(
    () => {
      claimed.holdExceeded = true;
      // This process's duplicates ask the store from now on: the key is free once the transaction has ended.
      claimed.held.leaseEndsAt = 0;
      onHoldExceeded();
      transaction.abort!().catch(() => undefined);
    },
    work.maxHoldMs ?? work.leaseMs * 10,
  );
  timer.unref?.();
  return () => clearTimeout(timer);
}
