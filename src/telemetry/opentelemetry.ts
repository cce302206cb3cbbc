import type { EngineObserver } from '../core/observer.js';
import type { IdempotencyEvents } from './events.js';
import { OpenTelemetryObserver } from './opentelemetry-observer.js';
import type { OtelApi } from './otel-api.js';

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
  return new OpenTelemetryObserver(
    api,
    tracer,
    {
      outcomes: meter.createCounter('idempotency.outcomes', { description: 'Idempotent executions by how they ended.' }),
      executionDuration: meter.createHistogram('idempotency.execution.duration', {
        description: 'Duration of an idempotent execution, claim to outcome.',
        unit: 'ms',
      }),
      claimDuration: meter.createHistogram('idempotency.claim.duration', { description: 'Duration of a claim.', unit: 'ms' }),
      sweepRuns: meter.createCounter('idempotency.sweeper.runs', {
        description: 'Sweeper runs, by whether they ran and failed.',
      }),
      swept: meter.createCounter('idempotency.sweeper.deleted', { description: 'Expired keys deleted by the sweeper.' }),
      sweepDuration: meter.createHistogram('idempotency.sweeper.duration', {
        description: 'Duration of a sweep.',
        unit: 'ms',
      }),
      outbox: meter.createCounter('idempotency.outbox.messages', {
        description: 'Outbox messages handled by the relay, by result.',
      }),
    },
    events,
  );
}

async function loadOpenTelemetry(): Promise<OtelApi | undefined> {
  try {
    const loaded = (await import('@opentelemetry/api')) as unknown as OtelApi & { default?: OtelApi };
    return loaded.trace ? loaded : loaded.default;
  } catch {
    return undefined;
  }
}
