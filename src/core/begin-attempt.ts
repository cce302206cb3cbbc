import type {
  BeginResult,
  ClaimMode,
  ClaimRef,
  ClaimRequest,
  ClaimResult,
  IdempotencyStore,
  OpenAttempt,
} from './idempotency-store.js';

/**
 * The start of one attempt on any store, made of its `claim` and its
 * `transaction`: claims the key and, when the claim is this attempt's, opens
 * the work's transaction (see `IdempotencyStore.begin` for the modes). The
 * engine uses it for a store without a `begin` of its own.
 */
export async function beginAttempt<Tx>(
  store: IdempotencyStore<Tx>,
  request: ClaimRequest,
  mode: ClaimMode,
  lockTimeoutMs = 0,
): Promise<BeginResult<Tx>> {
  if (mode === 'separate') {
    const claimedAt = Date.now();
    const claim = await store.claim(request);
    if (claim.state !== 'claimed') return { claim };
    let attempt: OpenAttempt<Tx>;
    let stillOurs = true;
    try {
      attempt = await openAttempt(store, request);
      // Waiting for the transaction's connection had no heartbeat: past a third of the lease, renew it (fenced)
      // before the work starts, and leave a claim another attempt has taken over meanwhile alone.
      if (Date.now() - claimedAt > request.leaseMs / 3 && store.renewLease) {
        stillOurs = await store.renewLease(request, request.leaseMs).catch(async (error: unknown) => {
          await attempt.rollback(false).catch(() => undefined);
          throw error;
        });
      }
    } catch (error) {
      // BEGIN failed, so the work never ran: give the claim back, so a retry need not wait out the lease.
      await store.release(request).catch(() => false);
      throw error;
    }
    if (stillOurs) return { claim, attempt };
    await attempt.rollback(false);
    return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
  }
  const attempt = await openAttempt(store, request);
  let claim: ClaimResult;
  try {
    claim = await store.claim(request, attempt.tx, lockTimeoutMs);
  } catch (error) {
    await attempt.rollback(false).catch(() => undefined);
    throw error;
  }
  if (claim.state === 'claimed') return { claim, attempt };
  await attempt.rollback(false);
  return { claim };
}

/**
 * An attempt on top of a store's callback-style `transaction`: the callback
 * is held open until the attempt ends.
 */
function openAttempt<Tx>(store: IdempotencyStore<Tx>, ref: ClaimRef): Promise<OpenAttempt<Tx>> {
  return new Promise((opened, failedToOpen) => {
    let isOpen = false;
    const ended = store
      .transaction(
        (tx) =>
          new Promise<void>((commitNow, rollBackNow) => {
            isOpen = true;
            let finished = false;
            const end = async (commit: boolean) => {
              if (finished) return;
              finished = true;
              if (commit) commitNow();
              else rollBackNow(ROLLED_BACK);
              await ended;
            };
            opened({
              tx,
              async commit(response, ttlMs) {
                let completed: boolean;
                try {
                  completed = await store.complete(ref, response, ttlMs, tx);
                } catch (error) {
                  await end(false).catch(() => undefined);
                  throw error;
                }
                await end(completed);
                return completed;
              },
              async rollback() {
                await end(false);
                return false;
              },
            });
          }),
      )
      .catch((error: unknown) => {
        if (error !== ROLLED_BACK) throw error;
      });
    ended.catch((error: unknown) => {
      if (!isOpen) failedToOpen(error);
    });
  });
}

/** What an attempt's held-open transaction callback rejects with to roll back. */
const ROLLED_BACK = Symbol('rolled back');
