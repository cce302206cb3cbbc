import { IdempotencyConfigurationError } from '../core/configuration-error.js';
import { DEFAULT_HEADER } from '../core/protocol.js';
import { systemClock, type ClientClock } from './clock.js';
import { clientMessages } from './messages.js';
import { RetryBudget, type RetryBudgetOptions } from './retry-budget.js';

/** `fetch` as the client calls it; Node's own by default. */
export type FetchFunction = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;
/** What `new Headers()` takes (Node's types have no global name for it). */
export type HeadersInput = ConstructorParameters<typeof Headers>[0];
/** `RequestInit['redirect']`: `'follow'`, `'manual'` or `'error'`. */
export type RedirectMode = NonNullable<RequestInit['redirect']>;

export interface IdempotentClientOptions {
  /** Request URLs are resolved against it. Default none: requests then give absolute URLs. */
  baseUrl?: string | URL;
  /** Sent with every request, e.g. `{ authorization: 'Bearer ...' }`. */
  headers?: HeadersInput;
  /** The header carrying the key. Default `'Idempotency-Key'`. */
  keyHeader?: string;
  /** Attempts per intent, the first included. Default 5. */
  maxAttempts?: number;
  /** Ceiling of the first backoff in ms; it doubles per retry up to `maxDelay`, and each wait is drawn below it (full jitter). Default 100. */
  initialDelay?: number;
  /** Largest backoff ceiling in ms. A longer `Retry-After` is still honoured, within the deadline. Default 5000. */
  maxDelay?: number;
  /** One attempt's time, until its answer is read in full, in ms; then it is aborted and counts as lost. Default 10 000. */
  attemptTimeout?: number;
  /** The intent's time, all attempts and waits included, in ms. Default 30 000. */
  deadline?: number;
  /**
   * Statuses retried with the same key. Default `[409, 502, 503, 504]`. A
   * 409 is retried only when it is the module's conflict or lease-lost
   * problem (its `type`): any other 409 is the application's answer. 408,
   * 425, 429 and other 5xx may be added; no other 4xx (see the client guide).
   */
  retryStatuses?: readonly number[];
  /** A budget shared with other clients, or the options of this client's own. Default 20 % of requests over 10 s, at least 10 retries. */
  budget?: RetryBudget | RetryBudgetOptions;
  /**
   * What to do with a 3xx. Default `'manual'`: the answer of the request that
   * carried the key (and says whether it was a replay) is the result.
   */
  redirect?: RedirectMode;
  /** Default the global `fetch`. */
  fetch?: FetchFunction;
  /** For tests; default the system clock. */
  clock?: ClientClock;
  /** Uniform in [0, 1), for the jitter; default `Math.random`. For tests. */
  random?: () => number;
}

/** Every default of the client, in one place. */
export const CLIENT_DEFAULTS = {
  keyHeader: DEFAULT_HEADER,
  maxAttempts: 5,
  initialDelay: 100,
  maxDelay: 5_000,
  attemptTimeout: 10_000,
  deadline: 30_000,
  retryStatuses: [409, 502, 503, 504],
  redirect: 'manual',
} as const;

/** 4xx statuses that mean "not now" rather than "not this request". */
const RETRYABLE_CLIENT_ERRORS = new Set([408, 409, 425, 429]);

export interface ClientSettings {
  baseUrl?: URL;
  headers: Headers;
  keyHeader: string;
  maxAttempts: number;
  initialDelay: number;
  maxDelay: number;
  attemptTimeout: number;
  deadline: number;
  retryStatuses: ReadonlySet<number>;
  budget: RetryBudget;
  redirect: RedirectMode;
  fetch: FetchFunction;
  clock: ClientClock;
  random: () => number;
}

/** Fills the defaults and refuses what cannot work, saying how to fix it. */
export function resolveClientOptions(options: IdempotentClientOptions = {}): ClientSettings {
  const clock = options.clock ?? systemClock;
  const keyHeader = options.keyHeader ?? CLIENT_DEFAULTS.keyHeader;
  if (typeof keyHeader !== 'string' || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(keyHeader)) {
    throw new IdempotencyConfigurationError(clientMessages.option('keyHeader', 'an HTTP header name', keyHeader));
  }
  const initialDelay = wholeMs('initialDelay', options.initialDelay ?? CLIENT_DEFAULTS.initialDelay, 0);
  const maxDelay = wholeMs('maxDelay', options.maxDelay ?? CLIENT_DEFAULTS.maxDelay, initialDelay);
  const retryStatuses = options.retryStatuses ?? CLIENT_DEFAULTS.retryStatuses;
  if (!Array.isArray(retryStatuses)) {
    throw new IdempotencyConfigurationError(clientMessages.option('retryStatuses', 'a list of HTTP statuses', retryStatuses));
  }
  for (const status of retryStatuses) {
    if (!Number.isInteger(status) || !(RETRYABLE_CLIENT_ERRORS.has(status) || (status >= 500 && status <= 599))) {
      throw new IdempotencyConfigurationError(clientMessages.retryStatus(status));
    }
  }
  let baseUrl: URL | undefined;
  if (options.baseUrl !== undefined) {
    try {
      baseUrl = new URL(options.baseUrl);
    } catch {
      throw new IdempotencyConfigurationError(clientMessages.option('baseUrl', 'an absolute URL', String(options.baseUrl)));
    }
  }
  const fetchFunction = options.fetch ?? globalThis.fetch;
  if (typeof fetchFunction !== 'function') {
    throw new IdempotencyConfigurationError(clientMessages.option('fetch', 'a fetch function', typeof fetchFunction));
  }
  return {
    baseUrl,
    headers: new Headers(options.headers),
    keyHeader,
    maxAttempts: whole('maxAttempts', options.maxAttempts ?? CLIENT_DEFAULTS.maxAttempts, 1),
    initialDelay,
    maxDelay,
    attemptTimeout: wholeMs('attemptTimeout', options.attemptTimeout ?? CLIENT_DEFAULTS.attemptTimeout, 1),
    deadline: wholeMs('deadline', options.deadline ?? CLIENT_DEFAULTS.deadline, 1),
    retryStatuses: new Set(retryStatuses),
    budget: options.budget instanceof RetryBudget ? options.budget : new RetryBudget({ clock, ...options.budget }),
    redirect: options.redirect ?? CLIENT_DEFAULTS.redirect,
    fetch: fetchFunction,
    clock,
    random: options.random ?? Math.random,
  };
}

/** A per-request override of a duration, checked like the client's own. */
export function requestMs(name: string, value: number | undefined, fallback: number): number {
  return value === undefined ? fallback : wholeMs(name, value, 1);
}

function whole(name: string, value: unknown, min: number): number {
  if (!Number.isSafeInteger(value) || (value as number) < min) {
    throw new IdempotencyConfigurationError(clientMessages.option(name, `a whole number of at least ${min}`, value));
  }
  return value as number;
}

function wholeMs(name: string, value: unknown, min: number): number {
  if (!Number.isSafeInteger(value) || (value as number) < min) {
    throw new IdempotencyConfigurationError(
      clientMessages.option(name, `a whole number of milliseconds, at least ${min}`, value),
    );
  }
  return value as number;
}
