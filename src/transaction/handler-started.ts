import { idempotencyContext } from './idempotency-context.js';

/** `handler`, recording in the request context when its body starts (an error before that, in a pipe, releases the key). */
export function recordingStart(handler: (...args: unknown[]) => unknown): (...args: unknown[]) => unknown {
  return function (this: unknown, ...args: unknown[]): unknown {
    const context = idempotencyContext.getStore();
    if (context) context.handlerStarted = true;
    return handler.apply(this, args);
  };
}
