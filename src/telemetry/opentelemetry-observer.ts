import type { EngineObserver, IdempotencyEvent, SpanAttributes } from '../core/observer.js';
import type { IdempotencyEvents } from './events.js';
import type { OtelApi, OtelInstruments, OtelTracer } from './otel-api.js';
import { recordSweepOrOutbox } from './sweep-and-outbox-metrics.js';
import { tracedSpan } from './traced-span.js';

/**
 * The engine's observer when `@opentelemetry/api` is installed (see `createEngineObserver`): each event recorded in
 * the metrics and handed to the typed event hook, and spans while an SDK's tracer provider is registered.
 */
export class OpenTelemetryObserver implements EngineObserver {
  /** What the API's global provider delegates to while no SDK is registered (a fresh proxy has no delegate). */
  private readonly noopProvider: unknown;

  constructor(
    private readonly api: OtelApi,
    private readonly tracer: OtelTracer,
    private readonly instruments: OtelInstruments,
    private readonly events: IdempotencyEvents,
  ) {
    this.noopProvider = new api.ProxyTracerProvider().getDelegate?.();
  }

  span<T>(
    name: string,
    attributes: SpanAttributes,
    fn: (annotate: (attributes: SpanAttributes) => void) => Promise<T>,
  ): Promise<T> {
    if (!this.tracing()) return fn(annotateNothing);
    return tracedSpan(this.api, this.tracer, name, attributes, fn);
  }

  emit(event: IdempotencyEvent, tenant?: string): void {
    this.record(event);
    this.events.emit(event, tenant);
  }

  private record(event: IdempotencyEvent): void {
    const { outcomes, executionDuration, claimDuration } = this.instruments;
    switch (event.type) {
      case 'outcome':
        outcomes.add(1, { outcome: event.outcome, route: event.route });
        executionDuration.record(event.durationMs, { outcome: event.outcome, route: event.route });
        return;
      case 'claim':
        claimDuration.record(event.durationMs, { state: event.state, route: event.route });
        return;
      default:
        recordSweepOrOutbox(event, this.instruments);
    }
  }

  /** Whether an SDK's tracer provider is registered now (perhaps only after start-up): else spans are skipped, not no-ops. */
  private tracing(): boolean {
    const provider = this.api.trace.getTracerProvider();
    return typeof provider.getDelegate !== 'function' || provider.getDelegate() !== this.noopProvider;
  }
}

const annotateNothing = () => undefined;
