import { recordingStart } from './handler-started.js';

const MARKED = Symbol('nest-idempotency:marked-handler');

/** Wraps a route handler once in `recordingStart`, at start-up. Nest's route metadata is on the function, so it is copied. */
export function markHandlerStart(handler: (...args: unknown[]) => unknown): (...args: unknown[]) => unknown {
  if ((handler as { [MARKED]?: boolean })[MARKED]) return handler;
  const marked = recordingStart(handler);
  Object.defineProperty(marked, 'name', { value: handler.name });
  for (const key of Reflect.getOwnMetadataKeys(handler)) {
    Reflect.defineMetadata(key, Reflect.getOwnMetadata(key, handler), marked);
  }
  Object.defineProperty(marked, MARKED, { value: true });
  return marked;
}
