import type { StoredResponse } from '../core/idempotency-store.js';

/** Raised when the application has not sent a response within the time the capture waits for one. */
export class ResponseNotSentError extends Error {
  constructor(waitedMs: number) {
    super(`The application sent no response within ${waitedMs} ms of the handler finishing.`);
    this.name = 'ResponseNotSentError';
  }
}

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
   * (still held). Rejects with `ResponseNotSentError` after `timeoutMs` (and
   * lets whatever comes later pass untouched), or with the capture's
   * `refusal` when the response cannot be stored.
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

/**
 * The body's own headers: stored whenever the application set them, and
 * removed from the answer a replacement goes out in, so none of the response
 * it replaces survive. `Content-Encoding` is among them because the capture
 * sits before the platform's compression: one set by then was set by the
 * application on bytes it encoded itself, and those bytes mean nothing
 * without it.
 */
export const BODY_HEADERS = ['content-type', 'content-encoding', 'etag', 'location', 'content-location'] as const;

/** Each allowlist's stored names, made once rather than per request (the allowlist is the module's resolved option). */
const storedNamesOf = new WeakMap<ReadonlySet<string>, ReadonlySet<string>>();

/** The lower-case names of the headers a capture stores. */
export function storedHeaderNames(replayHeaders: ReadonlySet<string>): ReadonlySet<string> {
  let names = storedNamesOf.get(replayHeaders);
  if (!names) {
    names = new Set<string>([...BODY_HEADERS, ...replayHeaders]);
    storedNamesOf.set(replayHeaders, names);
  }
  return names;
}

/**
 * The stored headers of a response as name/value pairs, one pair per value,
 * so a header sent several times is stored as sent and not joined. Names
 * keep the case and the order they were sent in (a replay must not differ
 * from the first answer even there); which are stored is decided without
 * regard to case.
 */
export function storedPairs(headers: Iterable<[string, unknown]>, stored: ReadonlySet<string>): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const [name, value] of headers) {
    if (!stored.has(name.toLowerCase()) || value === undefined || value === null) continue;
    for (const one of Array.isArray(value) ? value : [value]) {
      const text = String(one);
      if (text !== '') pairs.push([name, text]);
    }
  }
  return pairs;
}

/** Statuses that never carry a body (RFC 9110). */
export function hasBody(status: number): boolean {
  return !(status === 204 || status === 304 || (status >= 100 && status < 200));
}
