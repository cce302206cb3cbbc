import autocannon from 'autocannon';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { round, summarize, type LatencySummary } from './stats.js';

export interface LoadOptions {
  url: string;
  path: string;
  body: string;
  connections: number;
  /** Seconds of load; or `amount` requests in total (spread evenly over the connections). */
  seconds?: number;
  amount?: number;
  timeoutSeconds?: number;
  /** The Idempotency-Key of each request, called once per request sent; no header when absent. */
  key?: () => string;
}

export interface LoadResult {
  requests: number;
  seconds: number;
  rps: number;
  /** Every response's latency, whatever its status. */
  latency: LatencySummary;
  statuses: Record<string, number>;
  /** Responses carrying `Idempotent-Replayed: true`. */
  replayed: number;
  errors: number;
  timeouts: number;
}

/** A load result with its raw latencies, for merging rounds; the samples are not saved. */
export interface LoadRun extends LoadResult {
  samples: number[];
}

/**
 * Drives closed-loop HTTP load with autocannon. Latencies are collected per
 * response here, because autocannon's own histogram has 1 ms resolution,
 * too coarse for requests that take 1-5 ms.
 */
export function runLoad(options: LoadOptions): Promise<LoadRun> {
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  let replayed = 0;
  let startedAt = performance.now();
  const nextKey = options.key;
  return new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url: options.url,
        connections: options.connections,
        // autocannon rejects an explicit `duration: undefined`.
        ...(options.amount !== undefined ? { amount: options.amount } : { duration: options.seconds }),
        timeout: options.timeoutSeconds ?? 10,
        requests: [
          {
            method: 'POST',
            path: options.path,
            headers: { 'content-type': 'application/json' },
            body: options.body,
            setupRequest: nextKey
              ? (request) => {
                  request.headers = { ...request.headers, 'idempotency-key': nextKey() };
                  return request;
                }
              : undefined,
            onResponse: (_status, _body, _context, headers) => {
              for (const name in headers) {
                if (name.toLowerCase() === 'idempotent-replayed' && headers[name] === 'true') replayed++;
              }
            },
          },
        ],
      },
      (error, result) => {
        if (error) return reject(error instanceof Error ? error : new Error(String(error)));
        const seconds = (performance.now() - startedAt) / 1000;
        resolve({
          requests: latencies.length,
          seconds: round(seconds),
          rps: round(latencies.length / seconds, 1),
          latency: summarize(latencies),
          statuses,
          replayed,
          errors: result.errors,
          timeouts: result.timeouts,
          samples: latencies,
        });
      },
    );
    instance.on('start', () => (startedAt = performance.now()));
    instance.on('response', (_client, statusCode, _bytes, responseTime) => {
      latencies.push(responseTime);
      statuses[statusCode] = (statuses[statusCode] ?? 0) + 1;
    });
  });
}

/**
 * Open-loop load: `rate` requests a second for `seconds`, each sent on time
 * whether or not the earlier ones have answered. A closed loop would wait
 * for a slow answer before sending the next request and so hide the very
 * queueing a latency under contention is about (coordinated omission).
 */
export async function runAtRate(
  options: Omit<LoadOptions, 'connections' | 'amount' | 'seconds'> & { rate: number; seconds: number },
): Promise<LoadRun> {
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  let replayed = 0;
  let errors = 0;
  let timeouts = 0;
  const pending = new Set<Promise<void>>();
  const send = async () => {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (options.key) headers['idempotency-key'] = options.key();
    const t0 = performance.now();
    try {
      const response = await fetch(options.url + options.path, {
        method: 'POST',
        headers,
        body: options.body,
        signal: AbortSignal.timeout((options.timeoutSeconds ?? 10) * 1000),
      });
      await response.arrayBuffer();
      latencies.push(performance.now() - t0);
      statuses[response.status] = (statuses[response.status] ?? 0) + 1;
      if (response.headers.get('idempotent-replayed') === 'true') replayed++;
    } catch (error) {
      if (error instanceof Error && error.name === 'TimeoutError') timeouts++;
      else errors++;
    }
  };
  const started = performance.now();
  let issued = 0;
  for (;;) {
    const elapsed = (performance.now() - started) / 1000;
    if (elapsed >= options.seconds) break;
    for (const due = Math.floor(elapsed * options.rate); issued < due; issued++) {
      const request = send().finally(() => pending.delete(request));
      pending.add(request);
    }
    await sleep(2);
  }
  await Promise.all(pending);
  const seconds = (performance.now() - started) / 1000;
  return {
    requests: latencies.length,
    seconds: round(seconds),
    rps: round(latencies.length / seconds, 1),
    latency: summarize(latencies),
    statuses,
    replayed,
    errors,
    timeouts,
    samples: latencies,
  };
}

/** Counts of statuses outside `expected`, e.g. `{ "503": 2 }`; empty when all were expected. */
export function unexpectedStatuses(result: LoadResult, expected: number[]): Record<string, number> {
  return Object.fromEntries(Object.entries(result.statuses).filter(([status]) => !expected.includes(Number(status))));
}
