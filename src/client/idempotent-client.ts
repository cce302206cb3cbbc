import { randomUUID } from 'node:crypto';
import { ProblemType } from '../core/protocol.js';
import { fullJitterDelay, retryAfterMs } from './backoff.js';
import {
  requestMs,
  resolveClientOptions,
  type ClientSettings,
  type HeadersInput,
  type IdempotentClientOptions,
} from './client-options.js';
import { sleep } from './clock.js';
import { OutcomeUnknownError, type GiveUpReason } from './errors.js';
import { IdempotentResponse } from './idempotent-response.js';
import { clientMessages } from './messages.js';
import { keyHeaderValue } from './key-header.js';
import type { RetryBudget } from './retry-budget.js';

/** One intent: an operation the caller wants to happen once, however many attempts it takes. */
export interface IntentRequest {
  /** Resolved against the client's `baseUrl`. */
  url: string | URL;
  /** Default `'POST'`. */
  method?: string;
  /**
   * The intent's key, sent unchanged on every attempt. Default a random UUID
   * minted once, before the first attempt. Give one derived from what the
   * intent is about (`businessKey('order', 1042, 'capture')`) when a
   * restarted job or another process must recognise the same work.
   */
  key?: string;
  headers?: HeadersInput;
  /** Sent as JSON (serialised once, so every attempt sends the same bytes), with `Content-Type: application/json` unless set. */
  json?: unknown;
  /** A body other than JSON. Never a stream: every attempt must send the same bytes. */
  body?: string | Uint8Array | ArrayBuffer;
  /** Aborts the intent: the attempt in flight and any wait. */
  signal?: AbortSignal;
  /** This intent's deadline in ms, instead of the client's. */
  deadline?: number;
  /** This intent's attempt timeout in ms, instead of the client's. */
  attemptTimeout?: number;
}

type AttemptOutcome = { kind: 'answer'; status: number; headers: Headers; body: Uint8Array } | { kind: 'lost'; error: unknown };

/**
 * An HTTP client for idempotent endpoints, on `fetch`, without Nest. Each
 * intent carries one key on every attempt, so a retry can only replay what
 * the first attempt did, never do it again. It retries what a retry can
 * fix: lost answers (connection failures, attempt timeouts, a body cut
 * short), the module's 409s (another attempt holds the key, or lost its
 * lease) and 503 after their `Retry-After`, 502 and 504; never a replayed
 * answer, another 409 (the application's own), a 400, a 422 or a 500 (see
 * the client guide). Waits are exponential with full jitter, every
 * intent has a deadline, and retries draw on a budget shared by every
 * intent of the client, so an outage cannot multiply the load.
 *
 * ```ts
 * const payments = new IdempotentClient({ baseUrl: 'https://payments.internal', headers: { authorization } });
 * const charge = await payments.post('/charges', { amount: 4200, currency: 'eur', customer }, {
 *   key: businessKey('order', order.id, 'charge'),
 * });
 * charge.replayed; // true when an earlier attempt (or run) already charged
 * ```
 */
export class IdempotentClient {
  private readonly settings: ClientSettings;

  constructor(options: IdempotentClientOptions = {}) {
    this.settings = resolveClientOptions(options);
  }

  /** The retry budget this client draws on. */
  get budget(): RetryBudget {
    return this.settings.budget;
  }

  /** `request()` with method POST and a JSON body. */
  post(
    url: string | URL,
    json: unknown,
    options: Omit<IntentRequest, 'url' | 'method' | 'json' | 'body'> = {},
  ): Promise<IdempotentResponse> {
    return this.request({ ...options, url, method: 'POST', json });
  }

  /**
   * Sends the intent until it gets a final answer, or stops retrying.
   *
   * @returns the final answer, whatever its status; `gaveUp` is set when it
   *   was one the client would have retried (a 503 when the deadline came)
   * @throws OutcomeUnknownError when the last attempt got no answer at all,
   *   or the caller aborted: the intent may or may not have taken effect
   */
  async request(request: IntentRequest): Promise<IdempotentResponse> {
    const { clock, budget } = this.settings;
    const key = request.key ?? randomUUID();
    const init = this.attemptInit(request, keyHeaderValue(key));
    const url = this.resolve(request.url);
    // What fetch would refuse (a bad header, a GET with a body) fails now, not as a lost attempt.
    new Request(url, init);
    const deadline = requestMs('deadline', request.deadline, this.settings.deadline);
    const attemptTimeout = requestMs('attemptTimeout', request.attemptTimeout, this.settings.attemptTimeout);
    if (request.signal?.aborted) throw new OutcomeUnknownError(key, 0, 'aborted', request.signal.reason);

    const deadlineAt = clock.now() + deadline;
    budget.recordRequest();
    for (let attempts = 1; ; attempts++) {
      const timeout = Math.max(1, Math.min(attemptTimeout, deadlineAt - clock.now()));
      const outcome = await this.attempt(url, init, timeout, request.signal);
      if (outcome.kind === 'lost' && request.signal?.aborted) {
        throw new OutcomeUnknownError(key, attempts, 'aborted', request.signal.reason);
      }
      const answer = outcome.kind === 'answer' ? outcome : undefined;
      if (answer && !this.retries(answer))
        return new IdempotentResponse(key, answer.status, answer.headers, answer.body, attempts);

      // The server's Retry-After is a floor: waiting less only meets the same 409 or 503 again.
      const floor = answer ? (retryAfterMs(answer.headers.get('retry-after'), clock.now()) ?? 0) : 0;
      const delay = Math.max(floor, fullJitterDelay(attempts, this.settings, this.settings.random));
      const stop: GiveUpReason | undefined =
        attempts >= this.settings.maxAttempts
          ? 'attempts'
          : clock.now() + delay >= deadlineAt
            ? 'deadline'
            : !budget.tryRetry()
              ? 'budget'
              : undefined;
      if (stop) {
        if (answer) return new IdempotentResponse(key, answer.status, answer.headers, answer.body, attempts, stop);
        throw new OutcomeUnknownError(key, attempts, stop, (outcome as { error: unknown }).error);
      }
      try {
        await sleep(clock, delay, request.signal);
      } catch (reason) {
        throw new OutcomeUnknownError(key, attempts, 'aborted', reason);
      }
    }
  }

  /** A replay is the stored outcome: asking again can only replay it again. */
  private retries(answer: { status: number; headers: Headers; body: Uint8Array }): boolean {
    if (!this.settings.retryStatuses.has(answer.status) || answer.headers.get('idempotent-replayed') === 'true') return false;
    return answer.status !== 409 || isBusyKey(answer.body);
  }

  private async attempt(url: URL, init: RequestInit, timeoutMs: number, callerSignal?: AbortSignal): Promise<AttemptOutcome> {
    const timeout = new AbortController();
    const cancelTimeout = this.settings.clock.schedule(timeoutMs, () =>
      timeout.abort(new DOMException(clientMessages.attemptTimedOut(timeoutMs), 'TimeoutError')),
    );
    const signal = callerSignal ? AbortSignal.any([callerSignal, timeout.signal]) : timeout.signal;
    try {
      const response = await this.settings.fetch(url, { ...init, signal });
      // Read in full within the attempt: an answer cut short is as lost as a reset connection, and retried like one.
      const body = new Uint8Array(await response.arrayBuffer());
      return { kind: 'answer', status: response.status, headers: response.headers, body };
    } catch (error) {
      // Whatever failed (a reset, a refused connection, the timeout), no answer came: whether the server acted is unknown.
      return { kind: 'lost', error };
    } finally {
      cancelTimeout();
    }
  }

  private attemptInit(request: IntentRequest, keyValue: string): RequestInit {
    const headers = new Headers(this.settings.headers);
    new Headers(request.headers).forEach((value, name) => headers.set(name, value));
    if (headers.has(this.settings.keyHeader)) throw new TypeError(clientMessages.keyInHeaders(this.settings.keyHeader));
    headers.set(this.settings.keyHeader, keyValue);
    return {
      method: (request.method ?? 'POST').toUpperCase(),
      headers,
      body: this.encodeBody(request, headers),
      redirect: this.settings.redirect,
    };
  }

  private encodeBody(request: IntentRequest, headers: Headers): Uint8Array | undefined {
    if (request.json !== undefined && request.body !== undefined) throw new TypeError(clientMessages.bodyAndJson);
    if (request.json !== undefined) {
      if (!headers.has('content-type')) headers.set('content-type', 'application/json');
      return new TextEncoder().encode(JSON.stringify(request.json));
    }
    const body = request.body;
    if (body === undefined) return undefined;
    if (typeof body === 'string') return new TextEncoder().encode(body);
    if (body instanceof Uint8Array) return body;
    if (body instanceof ArrayBuffer) return new Uint8Array(body);
    throw new TypeError(clientMessages.body);
  }

  private resolve(url: string | URL): URL {
    try {
      return new URL(url, this.settings.baseUrl);
    } catch {
      throw new TypeError(clientMessages.relativeUrl);
    }
  }
}

/** The 409 problems that mean "the key is busy, ask again later" rather than an answer about the request. */
const BUSY_KEY_PROBLEMS: ReadonlySet<string> = new Set([ProblemType.conflict, ProblemType.leaseLost]);

/**
 * Whether a 409 is the module's own: its problem `type` says another attempt
 * holds the key, or this one lost its lease. Any other 409 is the
 * application's answer (an order that already exists, a version conflict):
 * asking again with the same key cannot change it.
 */
function isBusyKey(body: Uint8Array): boolean {
  let problem: unknown;
  try {
    problem = JSON.parse(new TextDecoder().decode(body));
  } catch {
    return false;
  }
  const type = (problem as { type?: unknown } | null)?.type;
  return typeof type === 'string' && BUSY_KEY_PROBLEMS.has(type);
}
