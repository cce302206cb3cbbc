import type { FetchFunction } from '../../../src/client/index.js';
import type { ManualClock } from './manual-clock.js';

/** What one attempt meets: an answer, a connection reset, or no answer until the attempt is aborted. */
export type Step = { status: number; headers?: Record<string, string>; body?: string } | 'reset' | 'hang';

export interface RecordedCall {
  /** The clock's time when the attempt was sent. */
  at: number;
  method: string;
  url: string;
  headers: Headers;
  body: string;
}

/**
 * A stand-in for the network in the client's unit tests (the e2e tests use
 * real HTTP): it plays `steps` in order, one per attempt, and records each
 * attempt as sent. A reset rejects as Node's fetch does (a TypeError whose
 * cause carries the code); a hang rejects only when the signal aborts.
 */
export function scriptedFetch(clock: ManualClock, steps: Step[] | (() => Step)) {
  const calls: RecordedCall[] = [];
  const fetch: FetchFunction = async (input, init = {}) => {
    const request = new Request(input, init);
    calls.push({
      at: clock.now(),
      method: request.method,
      url: request.url,
      headers: request.headers,
      body: await request.text(),
    });
    const step = typeof steps === 'function' ? steps() : steps.shift();
    if (step === undefined) throw new Error(`scriptedFetch: no step left for attempt ${calls.length}`);
    if (step === 'reset') {
      throw new TypeError('fetch failed', { cause: Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }) });
    }
    const signal = init.signal;
    if (step === 'hang') {
      return new Promise<Response>((_, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
      });
    }
    return new Response(step.body ?? null, { status: step.status, headers: step.headers });
  };
  return { fetch, calls };
}
