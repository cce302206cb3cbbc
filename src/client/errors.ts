import { clientMessages } from './messages.js';

/** Why the client stopped retrying an intent whose last answer could have been retried. */
export type GiveUpReason = 'attempts' | 'deadline' | 'budget';

/**
 * No attempt of an intent got an answer (connections failed, attempts timed
 * out) and the client stopped: the request may or may not have taken effect
 * on the server. Sending it again later with `key` is safe and tells which.
 */
export class OutcomeUnknownError extends Error {
  // Private and read through a getter, so logging the error does not print the key.
  readonly #key: string;

  constructor(
    key: string,
    /** Attempts made, 0 when the caller's signal was aborted before the first. */
    readonly attempts: number,
    readonly reason: GiveUpReason | 'aborted',
    cause: unknown,
  ) {
    super(clientMessages.outcomeUnknown(attempts, reason), { cause });
    this.name = 'OutcomeUnknownError';
    this.#key = key;
  }

  /** The key every attempt carried. */
  get key(): string {
    return this.#key;
  }
}
