/**
 * Outcomes of the engine that are not a response of the work. Framework-free:
 * the HTTP interceptor maps them to problem+json answers; other callers of
 * `IdempotencyService.execute` catch them directly.
 */
export abstract class IdempotencyError extends Error {
  protected constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Another attempt with the same key holds a valid lease. Retry after `retryAfterSeconds`. */
export class KeyInFlightError extends IdempotencyError {
  constructor(readonly retryAfterSeconds: number) {
    super(`Another request with this idempotency key is in progress; retry in ${retryAfterSeconds}s.`);
  }
}

/** The key was first used for a different request (method, path or body differ). */
export class FingerprintMismatchError extends IdempotencyError {
  constructor() {
    super('This idempotency key was already used for a different request.');
  }
}

/**
 * This attempt's lease ran out and another attempt took the key over before
 * this one could record its outcome; this attempt's writes were rolled back.
 */
export class LeaseLostError extends IdempotencyError {
  constructor() {
    super('The lease on this idempotency key was lost to another attempt; this attempt was rolled back.');
  }
}

/**
 * The store could not be reached. `outcome` says what that means for the work:
 * `'not-run'` when the claim itself failed (the work never started), or
 * `'unknown'` when the connection was lost after the work started, e.g. during
 * its COMMIT, which may or may not have happened. Either way, retrying with the
 * same key is safe and tells which.
 */
export class StoreUnavailableError extends IdempotencyError {
  /**
   * @param retryAfterSeconds when a retry can find the key free: set when the
   *   claim was made and is still held (its lease decides), absent when no
   *   claim was made.
   */
  constructor(
    cause: unknown,
    readonly outcome: 'not-run' | 'unknown' = 'not-run',
    readonly retryAfterSeconds?: number,
  ) {
    super(
      outcome === 'not-run'
        ? 'The idempotency store cannot be reached; the work did not run.'
        : 'The idempotency store was lost while the work ran; whether it committed is unknown until a retry with the same key.',
      { cause },
    );
  }
}

/**
 * The database refused to commit the work (a deferred constraint, a
 * serialization failure) or to complete its key: none of its writes took
 * effect. It is the work's failure, classified like an error the work threw;
 * `cause` is the database's error.
 */
export class CommitRefusedError extends IdempotencyError {
  constructor(cause: unknown) {
    super('The database refused to commit the work; none of its writes took effect.', { cause });
  }
}

/**
 * A value to fingerprint has no canonical form (a lone surrogate, a number
 * out of range, nesting past the depth limit): the request is refused before
 * anything is claimed.
 */
export class UnrepresentableInputError extends IdempotencyError {
  constructor(readonly reason: string) {
    super(`The request cannot be fingerprinted: ${reason}.`);
  }
}

/**
 * A tenant or key that cannot name a key in the store: not a string (a
 * Buffer, a number), empty, with a lone surrogate or with a NUL. A mistake
 * of the caller, refused before anything is claimed, since converting it
 * (a Buffer to text, a lone surrogate to U+FFFD) could make two tenants' or
 * two callers' keys meet. A `TypeError`, not an `IdempotencyError`: retrying
 * cannot help. The message never holds the value itself.
 */
export class IdempotencyInputError extends TypeError {
  constructor(
    readonly field: 'tenant' | 'key',
    readonly reason: string,
  ) {
    super(
      `The idempotency ${field} ${reason}. A tenant and a key must each be a non-empty string of well-formed Unicode ` +
        'without NUL characters; nothing was claimed or run.',
    );
    this.name = 'IdempotencyInputError';
  }
}

/**
 * Carries an error thrown by the work itself out of the store calls around
 * it, so it is never mistaken for a failure of the store: a payment
 * provider's `ECONNRESET` inside a handler is the handler's error.
 * Internal to the engine and `Phases`.
 */
export class WorkFailure {
  constructor(readonly error: unknown) {}
}
