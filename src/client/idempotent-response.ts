import { REPLAYED_HEADER } from '../core/protocol.js';
import type { GiveUpReason } from './errors.js';

/**
 * The final answer to an intent, its body read in full, with what it took
 * to get it.
 */
export class IdempotentResponse {
  // Private and read through a getter, so logging the response does not print the key.
  readonly #key: string;

  constructor(
    key: string,
    readonly status: number,
    readonly headers: Headers,
    readonly body: Uint8Array,
    /** Attempts made for the intent, this one included. */
    readonly attempts: number,
    /**
     * Set when this answer could have been retried (a 409, a 503...) but the
     * client stopped, and why. Unset when the answer is final in itself.
     */
    readonly gaveUp?: GiveUpReason,
  ) {
    this.#key = key;
  }

  /** The key every attempt carried: minted once for the intent, or the one the caller gave. */
  get key(): string {
    return this.#key;
  }

  get ok(): boolean {
    return this.status >= 200 && this.status < 300;
  }

  /**
   * The server answered with the stored response of an earlier attempt
   * (`Idempotent-Replayed: true`): the effect happened once, before.
   */
  get replayed(): boolean {
    return this.headers.get(REPLAYED_HEADER) === 'true';
  }

  text(): string {
    return new TextDecoder().decode(this.body);
  }

  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}
