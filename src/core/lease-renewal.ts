import type { Held } from './held.js';
import type { IdempotencyStore } from './idempotency-store.js';

/**
 * One beat of the heartbeat (see `HeldKeys.hold`): past `holdEndsAt` (`maxHoldMs` from the claim) it stops, so a
 * hung handler does not hold its key and connection for ever; else it renews the lease. A renewal that finds the
 * key taken stops the beat; one that cannot reach the store is tried at the next beat: the lease decides.
 */
export function renewLease<Tx>(
  store: IdempotencyStore<Tx>,
  held: Held,
  leaseMs: number,
  holdEndsAt: number,
  timer: ReturnType<typeof setInterval>,
  onHoldExceeded: () => void,
): void {
  const sentAt = Date.now();
  if (sentAt + leaseMs > holdEndsAt) {
    clearInterval(timer);
    onHoldExceeded();
    return;
  }
  store.renewLease!(held.ref, leaseMs).then(
    (ours) => {
      if (ours) held.leaseEndsAt = sentAt + leaseMs;
      else {
        // Taken over or released: duplicates here must ask the store (which lets them take over), not get 409.
        held.leaseEndsAt = 0;
        clearInterval(timer);
      }
    },
    () => undefined,
  );
}
