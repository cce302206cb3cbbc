import { performance } from 'node:perf_hooks';
import type { ClaimResult } from './idempotency-store.js';
import type { EngineObserver, IdempotencyOutcome } from './observer.js';
import type { Trace } from './trace.js';
import { outcomeOfError, storeFailure } from './outcomes.js';
import type { EngineOutcome, WorkScope } from './work.js';

/** One span around the execution, and one outcome event when it ends: the route and attempt, never key, tenant or body. */
export function observeExecution<R>(
  observer: EngineObserver,
  work: WorkScope,
  run: (trace: Trace) => Promise<EngineOutcome<R>>,
): Promise<EngineOutcome<R>> {
  const route = work.label ?? 'execute';
  return observer.span('idempotency.execute', { 'idempotency.route': route }, async (annotate) => {
    const trace: Trace = {};
    const started = performance.now();
    let outcome: IdempotencyOutcome = 'error';
    try {
      const result = await run(trace);
      if (result.kind === 'executed') outcome = (trace.attempt ?? 1) > 1 ? 'takeover' : 'executed';
      else outcome = result.kind;
      return result;
    } catch (error) {
      outcome = trace.failure ?? outcomeOfError(error);
      throw error;
    } finally {
      annotate({ 'idempotency.outcome': outcome, ...(trace.attempt ? { 'idempotency.attempt': trace.attempt } : {}) });
      observer.emit(
        { type: 'outcome', outcome, route, attempt: trace.attempt, durationMs: performance.now() - started },
        work.tenant,
      );
    }
  });
}

/** A store's claim (and BEGIN), in a span of its own, with a claim event. A store that cannot be reached means the work never ran. */
export async function observedClaim<T extends { claim: ClaimResult }>(
  observer: EngineObserver,
  isUnavailable: (error: unknown) => boolean,
  work: WorkScope,
  claim: () => Promise<T>,
): Promise<T> {
  const started = performance.now();
  let state: ClaimResult['state'] | 'failed' = 'failed';
  try {
    return await observer.span('idempotency.claim', {}, async (annotate) => {
      const result = await claim();
      state = result.claim.state;
      annotate({ 'idempotency.claim.state': state });
      return result;
    });
  } catch (error) {
    throw storeFailure(error, isUnavailable, 'claim');
  } finally {
    observer.emit({ type: 'claim', state, route: work.label ?? 'execute', durationMs: performance.now() - started });
  }
}

/** A store's completion, in a span of its own. */
export function observedComplete(observer: EngineObserver, complete: () => Promise<boolean>): Promise<boolean> {
  return observer.span('idempotency.complete', {}, async (annotate) => {
    const completed = await complete();
    annotate({ 'idempotency.completed': completed });
    return completed;
  });
}
