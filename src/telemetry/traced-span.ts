import type { SpanAttributes } from '../core/observer.js';
import type { OtelApi, OtelTracer } from './otel-api.js';

/** Runs `fn` in an active span of `tracer`, while an SDK's tracer provider is registered (no request runs it otherwise). */
export function tracedSpan<T>(
  api: OtelApi,
  tracer: OtelTracer,
  name: string,
  attributes: SpanAttributes,
  fn: (annotate: (attributes: SpanAttributes) => void) => Promise<T>,
): Promise<T> {
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await fn((more) => span.setAttributes(more));
    } catch (error) {
      // The error's name only: a message can quote anything, a key included.
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.name : 'error' });
      throw error;
    } finally {
      span.end();
    }
  });
}
