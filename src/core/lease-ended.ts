import { localId, type HeldKeys } from './held-keys.js';

/** An operator ended the lease of this process's attempt on `(tenant, key)`: its duplicates here ask the store. */
export function forgetLease(held: HeldKeys<unknown>, tenant: string, key: string): void {
  const running = held.local.get(localId({ tenant, key }));
  if (running) running.held.leaseEndsAt = 0;
}
