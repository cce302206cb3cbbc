/**
 * How one idempotent execution ended, one per request or `execute()` call:
 * - `executed`: a new claim ran and committed; `takeover`: the same, after
 *   taking over a key whose previous attempt's lease had ended.
 * - `replayed`: a stored response was returned.
 * - `conflict`: another attempt held the key (409 / `KeyInFlightError`).
 * - `mismatch`: the key was used for another request (422).
 * - `lease-lost`: this attempt outran its lease and was rolled back.
 * - `released`, `kept`, `failure-stored`: the work failed, and the key was
 *   given back, kept until its lease ends, or completed with the failure.
 * - `unavailable`: a store call of the module could not reach the database.
 * - `error`: anything else the module did not expect (a bug, logged).
 */
export type IdempotencyOutcome =
  | 'executed'
  | 'takeover'
  | 'replayed'
  | 'conflict'
  | 'mismatch'
  | 'lease-lost'
  | 'released'
  | 'kept'
  | 'failure-stored'
  | 'unavailable'
  | 'error';

/**
 * What the module reports about its work. No event carries a key, a tenant
 * or a body: `route` names the controller method (`ChargesController.create`)
 * or the label of an `execute()` call.
 */
export type IdempotencyEvent =
  | { type: 'outcome'; outcome: IdempotencyOutcome; route: string; attempt?: number; durationMs: number }
  | { type: 'claim'; state: 'claimed' | 'in-flight' | 'completed' | 'mismatch' | 'failed'; route: string; durationMs: number }
  | { type: 'sweep'; ran: boolean; failed: boolean; deleted: number; batches: number; durationMs: number }
  | {
      type: 'outbox';
      claimed: number;
      delivered: number;
      retried: number;
      deadLettered: number;
      timedOut: number;
      unsettled: number;
    };

/** Attributes of a span: only the module's own names and small values, never a key, a tenant or a body. */
export type SpanAttributes = Record<string, string | number | boolean>;

/**
 * What the engine tells the outside world, framework-free: spans around an
 * execution and its store calls, and events. The module gives it one that
 * writes OpenTelemetry spans and metrics when `@opentelemetry/api` is
 * installed, and the typed event hook in any case.
 */
export interface EngineObserver {
  /** Runs `fn` inside a span named `name`; `annotate` adds attributes to it. */
  span<T>(
    name: string,
    attributes: SpanAttributes,
    fn: (annotate: (attributes: SpanAttributes) => void) => Promise<T>,
  ): Promise<T>;
  /**
   * `tenant`: the tenant of an outcome, for in-process listeners that keep
   * per-tenant figures (the operator board). Never put into telemetry.
   */
  emit(event: IdempotencyEvent, tenant?: string): void;
}

/** An observer that records nothing. */
export const SILENT_OBSERVER: EngineObserver = {
  span: (_name, _attributes, fn) => fn(() => undefined),
  emit: () => undefined,
};
