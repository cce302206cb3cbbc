import { idempotencyContext } from '../transaction/idempotency-context.js';
import type { IdempotencyRuntime } from './run-idempotent.js';

/** Runs `fn` with the data source's plain manager as the request context (a route without a key). */
export function withoutIdempotency<T>(runtime: IdempotencyRuntime, fn: () => T): T {
  return idempotencyContext.run(runtime.newContext(), fn);
}
