import type { SpanAttributes } from '../core/observer.js';

/*
 * The parts of `@opentelemetry/api` used here, written out so that no type of
 * the optional peer reaches the module's own declarations.
 */
export interface OtelSpan {
  setAttributes(attributes: SpanAttributes): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
}
export interface OtelTracerProvider {
  getDelegate?(): unknown;
}
export interface OtelTracer {
  startActiveSpan<T>(name: string, options: { attributes: SpanAttributes }, fn: (span: OtelSpan) => T): T;
}
export interface OtelCounter {
  add(value: number, attributes?: SpanAttributes): void;
}
export interface OtelHistogram {
  record(value: number, attributes?: SpanAttributes): void;
}
export interface OtelApi {
  ProxyTracerProvider: new () => OtelTracerProvider;
  trace: {
    getTracerProvider(): OtelTracerProvider;
    getTracer(name: string, version?: string): OtelTracer;
  };
  metrics: {
    getMeter(
      name: string,
      version?: string,
    ): {
      createCounter(name: string, options: { description: string; unit?: string }): OtelCounter;
      createHistogram(name: string, options: { description: string; unit?: string }): OtelHistogram;
    };
  };
  SpanStatusCode: { ERROR: number };
}

/** The module's metrics, made once at start-up. */
export interface OtelInstruments {
  outcomes: OtelCounter;
  executionDuration: OtelHistogram;
  claimDuration: OtelHistogram;
  sweepRuns: OtelCounter;
  swept: OtelCounter;
  sweepDuration: OtelHistogram;
  outbox: OtelCounter;
}
