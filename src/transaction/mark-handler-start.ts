import { idempotencyContext } from './idempotency-context.js';

const MARKED = Symbol('nest-idempotency:marked-handler');

/**
 * Wraps a route handler so the request context records when its body starts
 * (an error before that, in a pipe, releases the key). Nest's route metadata
 * is on the function, so it is copied.
 */
export function markHandlerStart(handler: (...args: unknown[]) => unknown): (...args: unknown[]) => unknown {
  if ((handler as { [MARKED]?: boolean })[MARKED]) return handler;
  const marked = function (this: unknown, ...args: unknown[]): unknown {
    const context = idempotencyContext.getStore();
    if (context) context.handlerStarted = true;
    return handler.apply(this, args);
  };
  Object.defineProperty(marked, 'name', { value: handler.name });
  for (const key of Reflect.getOwnMetadataKeys(handler)) {
    Reflect.defineMetadata(key, Reflect.getOwnMetadata(key, handler), marked);
  }
  Object.defineProperty(marked, MARKED, { value: true });
  return marked;
}
