import type { FetchFunction } from '../client/client-options.js';
import { downstreamKeyFor, resolveDownstreamKeyOptions, type DownstreamKeyOptions } from './downstream-request-key.js';

/** `fetch`'s init, plus the call's purpose for its derived key. */
export type DownstreamRequestInit = RequestInit & {
  /** Names the operation (`'charge'`, `'refund'`); default the method and path. See `createDownstreamFetch`. */
  idempotencyPurpose?: string;
};

export type DownstreamFetch = (input: string | URL | Request, init?: DownstreamRequestInit) => Promise<Response>;

export interface DownstreamFetchOptions extends DownstreamKeyOptions {
  /** The fetch to wrap; default the global one. */
  fetch?: FetchFunction;
}

/**
 * A `fetch` for calls to other systems (a payment provider, another
 * service) made while an idempotent request or execution runs: a POST or
 * PATCH made inside one carries `Idempotency-Key: <derived key>`, the same on
 * every retry and takeover of the request, so the other system deduplicates
 * the call without a hand-written header. Outside an idempotent execution,
 * and when the call sets the header itself, it is plain `fetch`.
 *
 * ```ts
 * const providerFetch = createDownstreamFetch({ maxLength: 64 });
 * // inside an @Idempotent() handler:
 * await providerFetch('https://api.provider.example/v1/charges', { method: 'POST', body, idempotencyPurpose: 'charge' });
 * ```
 *
 * Give each call a purpose when a request makes more than one call to the
 * same method and path, or when its path holds a value that changes between
 * attempts (a fresh id, a timestamp).
 */
export function createDownstreamFetch(options: DownstreamFetchOptions = {}): DownstreamFetch {
  const { fetch: wrapped, ...keyOptions } = options;
  const resolved = resolveDownstreamKeyOptions(keyOptions);
  // Async, so that a refusal (a repeated call without a purpose) rejects as a failed fetch does, rather than throwing.
  return async (input, init = {}) => {
    const { idempotencyPurpose, ...rest } = init;
    const fetchFunction = wrapped ?? globalThis.fetch;
    const request = input instanceof Request ? input : undefined;
    // As fetch merges them: the init's headers replace the Request's.
    const headers = new Headers(rest.headers ?? request?.headers);
    if (headers.has(resolved.header)) return fetchFunction(input, rest);
    const method = rest.method ?? request?.method ?? 'GET';
    const key = downstreamKeyFor(method, request?.url ?? String(input), idempotencyPurpose, resolved);
    if (key === undefined) return fetchFunction(input, rest);
    headers.set(resolved.header, key);
    return fetchFunction(input, { ...rest, headers });
  };
}
