import type { StoredResponse } from '../core/idempotency-store.js';

/** What a capture keeps of a response, and how much of it it may hold. */
export interface CaptureSettings {
  /** Lower-case names of the response headers that are stored besides the body's own (the replay allowlist). */
  replayHeaders: ReadonlySet<string>;
  /** Longest body, in bytes, that is held and stored; a longer one is refused (`ResponseTooLargeError`). */
  maxBytes: number;
}

/** Headers the module adds to a replacement (e.g. `Idempotent-Replayed`). */
export type ExtraHeaders = Array<[string, string]>;

/**
 * Holds one HTTP response where the platform sends it, after every
 * interceptor, serializer and exception filter of the application and before
 * any content encoding, until the key's outcome is committed. Then either the
 * held response goes on as the application made it (`release`), or another
 * one in its place (`replace`: a replay, or the module's own problem answer),
 * which goes through the same last steps (compression, the app's cookies and
 * security headers) as any other answer of the app.
 */
export interface ResponseCapture {
  /**
   * Resolves with the response as the application sent it, once it has
   * (still held). Rejects with `ResponseNotSentError` after `timeoutMs` (the
   * response still held, for the caller to release or replace), or with the
   * capture's `refusal` when the response cannot be stored.
   */
  sent(timeoutMs: number): Promise<StoredResponse>;
  /** Lets the held response go out as the application made it; anything later passes straight through. */
  release(): void;
  /**
   * Sends `response` instead of what the application sends: now if it has
   * sent already, else as soon as it does. Headers the application set that
   * are not about the body (a request id, security headers, its cookies)
   * are kept, as they would be on any answer.
   */
  replace(response: StoredResponse, headers?: ExtraHeaders): void;
  /** Set when the response the application sent cannot be stored (too large, a stream): answer with a problem instead. */
  readonly refusal?: Error;
}
