import type { StoredResponse } from './idempotency-store.js';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  IdempotencyError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './errors.js';
import type { IdempotencyOutcome } from './observer.js';

/*
 * What a failure means, in one place and with no knowledge of HTTP or Nest:
 * an error at a moment of the lifecycle becomes what happens to the key
 * (store the failure, release the key, keep it) or one of the engine's own
 * outcomes. The transports only give it a face (a problem document, a
 * GraphQL error, a message ack): see transports/outcome-answers.ts.
 *
 *   moment              error                                 becomes
 *   claim               the store cannot be reached           StoreUnavailableError 'not-run' (503)
 *   claim               the key is held / completed / other   KeyInFlightError (409) / a replay / FingerprintMismatchError (422)
 *   work                thrown before the handler's body ran  release (a pipe or guard refused it: nothing took effect)
 *   work                a definite answer (4xx, RPC error)    the route's onHttpException: store | release | keep
 *   work                anything else (5xx, a crash)          the route's onError: store | release | keep
 *   commit              the database refused it               CommitRefusedError, then classified as the work's failure
 *   commit, after work  the store cannot be reached           StoreUnavailableError 'unknown' (503, retry tells)
 *   commit              the fence failed / maxHold ended it   LeaseLostError (409 lease-lost)
 */

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

/** The failure policies a route chooses between (`onHttpException`, `onError`). */
export type FailurePolicy = 'store' | 'release' | 'keep';

/** How a transport reads a failure of the handler's body. */
export type FailureReading =
  /** `definite`: the handler's own answer (an HTTP 4xx, a GraphQL or RPC error): `onHttpException` applies, else `onError`. */
  | { definite: boolean; response: () => Promise<StoredResponse | null> }
  /** A decision the transport makes itself (e.g. a response that cannot be stored). */
  | FailureDecision;

/**
 * The decision for a failure of the work, once its writes rolled back.
 *
 * @param handlerStarted whether the handler's own body ran: before that (a
 *   validation pipe, a guard) nothing took effect, whatever the error
 * @param decided told which policy decided (`'rejected'`: the body never ran)
 */
export async function decideFailure(
  error: unknown,
  reading: FailureReading,
  handlerStarted: boolean,
  policies: { onHttpException: FailurePolicy; onError: FailurePolicy },
  decided?: (policy: FailurePolicy | 'rejected') => void,
): Promise<FailureDecision> {
  if ('action' in reading) return reading;
  // A refused COMMIT comes after the body ran, whatever the context recorded.
  if (!handlerStarted && !(error instanceof CommitRefusedError)) {
    decided?.('rejected');
    return { action: 'release' };
  }
  const policy = reading.definite ? policies.onHttpException : policies.onError;
  decided?.(policy);
  if (policy !== 'store') return { action: policy };
  const response = await reading.response();
  return response ? { action: 'store', response } : { action: 'keep' };
}

/**
 * A store call that failed: "cannot reach the database" becomes the engine's
 * `StoreUnavailableError` (at the claim the work never ran; after it started,
 * its outcome is unknown until a retry); anything else is returned as it is.
 */
export function storeFailure(
  error: unknown,
  isUnavailable: (error: unknown) => boolean,
  moment: 'claim' | 'after-work-started',
  retryAfterSeconds?: number,
): unknown {
  if (error instanceof IdempotencyError || !isUnavailable(error)) return error;
  return moment === 'claim'
    ? new StoreUnavailableError(error, 'not-run')
    : new StoreUnavailableError(error, 'unknown', retryAfterSeconds);
}

/** The outcome label (events, metrics, spans) of an execution that ended with `error`. */
export function outcomeOfError(error: unknown): IdempotencyOutcome {
  if (error instanceof KeyInFlightError) return 'conflict';
  if (error instanceof FingerprintMismatchError) return 'mismatch';
  if (error instanceof LeaseLostError) return 'lease-lost';
  if (error instanceof StoreUnavailableError) return 'unavailable';
  return 'error';
}
