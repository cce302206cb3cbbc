/** How long to wait before retry number `retry` (1 for the first retry). */
export interface BackoffOptions {
  /** The ceiling of the first wait, in ms; each retry doubles it. */
  initialDelay: number;
  /** No wait ceiling grows past this, in ms. */
  maxDelay: number;
}

/**
 * Exponential backoff with full jitter: a wait drawn uniformly from
 * [0, min(maxDelay, initialDelay * 2^(retry - 1))). Clients that failed
 * together (an outage, a deploy) then spread out instead of returning
 * together, which is what "equal" or no jitter gets wrong.
 *
 * @param random uniform in [0, 1), `Math.random` unless a test fixes it
 */
export function fullJitterDelay(retry: number, options: BackoffOptions, random: () => number): number {
  const ceiling = Math.min(options.maxDelay, options.initialDelay * 2 ** Math.max(0, retry - 1));
  return Math.floor(random() * ceiling);
}

/** RFC 9110's preferred HTTP-date, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`. */
const IMF_FIXDATE = /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/;

/**
 * A `Retry-After` value in ms from `now`: delta-seconds (`"5"`) or an
 * HTTP-date. Undefined when absent or unreadable, so the caller falls back
 * to its own backoff; a date in the past is 0.
 */
export function retryAfterMs(value: string | null, now: number): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1_000;
  // Only the strict form: Date.parse alone also reads "1.5" or "2026-01-01" as dates.
  if (!IMF_FIXDATE.test(trimmed)) return undefined;
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}
