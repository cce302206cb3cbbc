import type { EngineObserver, IdempotencyEvent, SpanAttributes } from '../core/observer.js';
import type { IdempotencyEvents } from './events.js';

/*
 * The parts of `@opentelemetry/api` used here, written out so that no type of
 * the optional peer reaches the module's own declarations.
 */
interface OtelSpan {
  setAttributes(attributes: SpanAttributes): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
}
interface OtelTracerProvider {
  getDelegate?(): unknown;
}
interface OtelApi {
  ProxyTracerProvider: new () => OtelTracerProvider;
  trace: {
    getTracerProvider(): OtelTracerProvider;
    getTracer(
      name: string,
      version?: string,
    ): {
      startActiveSpan<T>(name: string, options: { attributes: SpanAttributes }, fn: (span: OtelSpan) => T): T;
    };
  };
  metrics: {
    getMeter(
      name: string,
      version?: string,
    ): {
      createCounter(
        name: string,
        options: { description: string; unit?: string },
      ): { add(value: number, attributes?: SpanAttributes): void };
      createHistogram(
        name: string,
        options: { description: string; unit?: string },
      ): {
        record(value: number, attributes?: SpanAttributes): void;
      };
    };
  };
  SpanStatusCode: { ERROR: number };
}

const INSTRUMENTATION = 'nest-idempotency-pg';

/**
 * The engine's observer: the typed events always, and OpenTelemetry spans
 * and metrics when `@opentelemetry/api` is installed (an optional peer,
 * loaded here only). Without an SDK registered by the app, the API's calls
 * are no-ops, as OpenTelemetry intends for libraries.
 *
 * Spans: `idempotency.execute` (attributes `idempotency.route`,
 * `idempotency.outcome`, `idempotency.attempt`) with children
 * `idempotency.claim` (`idempotency.claim.state`) and `idempotency.complete`.
 * Metrics: `idempotency.outcomes` (counter, by `outcome` and `route`),
 * `idempotency.execution.duration` and `idempotency.claim.duration`
 * (histograms, ms), `idempotency.sweeper.deleted`, `idempotency.sweeper.runs`,
 * `idempotency.sweeper.duration`, and `idempotency.outbox.messages` (by
 * `result`). Never a key, a tenant or a body.
 */
export async function createEngineObserver(events: IdempotencyEvents, useOpenTelemetry: boolean): Promise<EngineObserver> {
  const api = useOpenTelemetry ? await loadOpenTelemetry() : undefined;
  if (!api) return { span: (_name, _attributes, fn) => fn(() => undefined), emit: (event, tenant) => events.emit(event, tenant) };

  const tracer = api.trace.getTracer(INSTRUMENTATION);
  const meter = api.metrics.getMeter(INSTRUMENTATION);
  const outcomes = meter.createCounter('idempotency.outcomes', { description: 'Idempotent executions by how they ended.' });
  const executionDuration = meter.createHistogram('idempotency.execution.duration', {
    description: 'Duration of an idempotent execution, claim to outcome.',
    unit: 'ms',
  });
  const claimDuration = meter.createHistogram('idempotency.claim.duration', { description: 'Duration of a claim.', unit: 'ms' });
  const sweepRuns = meter.createCounter('idempotency.sweeper.runs', {
    description: 'Sweeper runs, by whether they ran and failed.',
  });
  const swept = meter.createCounter('idempotency.sweeper.deleted', { description: 'Expired keys deleted by the sweeper.' });
  const sweepDuration = meter.createHistogram('idempotency.sweeper.duration', {
    description: 'Duration of a sweep.',
    unit: 'ms',
  });
  const outbox = meter.createCounter('idempotency.outbox.messages', {
    description: 'Outbox messages handled by the relay, by result.',
  });

  const record = (event: IdempotencyEvent) => {
    switch (event.type) {
      case 'outcome':
        outcomes.add(1, { outcome: event.outcome, route: event.route });
        executionDuration.record(event.durationMs, { outcome: event.outcome, route: event.route });
        return;
      case 'claim':
        claimDuration.record(event.durationMs, { state: event.state, route: event.route });
        return;
      case 'sweep':
        sweepRuns.add(1, { ran: event.ran, failed: event.failed });
        if (event.deleted > 0) swept.add(event.deleted);
        if (event.ran) sweepDuration.record(event.durationMs);
        return;
      case 'outbox':
        for (const result of ['delivered', 'retried', 'deadLettered', 'timedOut', 'unsettled'] as const) {
          if (event[result] > 0) outbox.add(event[result], { result });
        }
        return;
    }
  };

  // What the API's global provider delegates to while no SDK is registered (a fresh proxy has no delegate).
  const noopProvider = new api.ProxyTracerProvider().getDelegate?.();
  /**
   * Whether an SDK's tracer provider is registered now (it may be after the
   * module starts). Without one every span is a no-op, but still costs a
   * context switch, closures and promises per request: skipped then.
   */
  const tracing = () => {
    const provider = api.trace.getTracerProvider();
    return typeof provider.getDelegate !== 'function' || provider.getDelegate() !== noopProvider;
  };
  const annotateNothing = () => undefined;

  return {
    span: (name, attributes, fn) =>
      !tracing()
        ? fn(annotateNothing)
        : tracer.startActiveSpan(name, { attributes }, async (span) => {
            try {
              return await fn((more) => span.setAttributes(more));
            } catch (error) {
              // The error's name only: a message can quote anything, a key included.
              span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.name : 'error' });
              throw error;
            } finally {
              span.end();
            }
          }),
    emit: (event, tenant) => {
      record(event);
      events.emit(event, tenant);
    },
  };
}

async function loadOpenTelemetry(): Promise<OtelApi | undefined> {
  try {
    const loaded = (await import('@opentelemetry/api')) as unknown as OtelApi & { default?: OtelApi };
    return loaded.trace ? loaded : loaded.default;
  } catch {
    return undefined;
  }
}
