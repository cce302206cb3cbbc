/**
 * Time as the client sees it. Tests pass a manual clock so that backoff,
 * Retry-After, deadlines and the budget's window can be stepped through
 * without waiting.
 */
export interface ClientClock {
  /** Milliseconds since the Unix epoch (an HTTP-date `Retry-After` is compared with it). */
  now(): number;
  /** Calls `callback` once, `ms` from now; the returned function cancels it. */
  schedule(ms: number, callback: () => void): () => void;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: ClientClock = {
  now: () => Date.now(),
  schedule: (ms, callback) => {
    const timer = setTimeout(callback, ms);
    return () => clearTimeout(timer);
  },
};

/** Resolves after `ms` on `clock`; rejects with the signal's reason as soon as `signal` aborts. */
export function sleep(clock: ClientClock, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      cancel();
      reject(signal?.reason);
    };
    const cancel = clock.schedule(ms, () => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    });
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
