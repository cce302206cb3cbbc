import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { context, metrics, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { IdempotencyEvents, type IdempotencyEvent } from '../src/index.js';
import { post, sleep } from './support/http.js';
import { useApiSuite } from './support/suite.js';
import { ADAPTERS } from './support/test-app.js';

// An app's own OpenTelemetry SDK, registered before the module boots, as an app's tracing setup would be.
const spans = new InMemorySpanExporter();
const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
const reader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 3_600_000 });
const contextManager = new AsyncLocalStorageContextManager().enable();
context.setGlobalContextManager(contextManager);
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));
const meterProvider = new MeterProvider({ readers: [reader] });
metrics.setGlobalMeterProvider(meterProvider);

afterAll(async () => {
  await meterProvider.shutdown();
  contextManager.disable();
});

/** Every data point of the counter `name`, as attributes and value. */
async function counterPoints(name: string): Promise<Array<{ attributes: Record<string, unknown>; value: number }>> {
  await reader.forceFlush();
  const exported = metricExporter.getMetrics();
  const latest = exported[exported.length - 1];
  const metric = latest?.scopeMetrics.flatMap((scope) => scope.metrics).find((m) => m.descriptor.name === name);
  return (metric?.dataPoints ?? []).map((point) => ({ attributes: point.attributes, value: point.value as number }));
}

describe.each(ADAPTERS)('telemetry over %s', (adapter) => {
  const t = useApiSuite(adapter, 'telemetry');
  const events: IdempotencyEvent[] = [];
  beforeAll(() => {
    t.api.app.get(IdempotencyEvents).subscribe((event) => events.push(event));
  });

  it('a span per execution with claim and completion children; outcomes counted; events emitted; never a key or a tenant', async () => {
    spans.reset();
    events.length = 0;
    const label = t.fresh();
    const key = `telemetry-key-${label}`;
    expect((await post(t.api.url, '/items', { label }, key, 'tenant-secret')).status).toBe(201);
    expect((await post(t.api.url, '/items', { label }, key, 'tenant-secret')).headers['idempotent-replayed']).toBe('true');
    expect((await post(t.api.url, '/items', { label, other: 1 }, key, 'tenant-secret')).status).toBe(422);
    t.api.probe.delays.set(`${label}-slow`, [400]);
    const slow = post(t.api.url, '/slow', { label: `${label}-slow` }, `${key}-slow`, 'tenant-secret');
    for (let i = 0; i < 500 && t.api.probe.count(`${label}-slow`) === 0; i++) await sleep(10);
    expect((await post(t.api.url, '/slow', { label: `${label}-slow` }, `${key}-slow`, 'tenant-secret')).status).toBe(409);
    await slow;

    const finished = spans.getFinishedSpans();
    const executions = finished.filter((s) => s.name === 'idempotency.execute');
    const outcomeOf = (s: ReadableSpan) => s.attributes['idempotency.outcome'];
    expect(executions.map(outcomeOf).sort()).toEqual(['conflict', 'executed', 'executed', 'mismatch', 'replayed']);
    const first = executions.find(
      (s) => outcomeOf(s) === 'executed' && s.attributes['idempotency.route'] === 'EffectsController.create',
    )!;
    expect(first.attributes).toMatchObject({ 'idempotency.route': 'EffectsController.create', 'idempotency.attempt': 1 });
    const children = finished.filter((s) => s.parentSpanContext?.spanId === first.spanContext().spanId).map((s) => s.name);
    expect(children.sort()).toEqual(['idempotency.claim', 'idempotency.complete']);
    const claim = finished.find(
      (s) => s.name === 'idempotency.claim' && s.parentSpanContext?.spanId === first.spanContext().spanId,
    )!;
    expect(claim.attributes['idempotency.claim.state']).toBe('claimed');
    for (const span of finished) {
      const text = JSON.stringify(span.attributes);
      expect(text).not.toContain(key);
      expect(text).not.toContain('tenant-secret');
    }

    const outcomes = await counterPoints('idempotency.outcomes');
    const count = (outcome: string) =>
      outcomes.filter((p) => p.attributes.outcome === outcome).reduce((sum, p) => sum + p.value, 0);
    expect(count('executed')).toBeGreaterThanOrEqual(2);
    expect(count('replayed')).toBeGreaterThanOrEqual(1);
    expect(count('conflict')).toBeGreaterThanOrEqual(1);
    expect(count('mismatch')).toBeGreaterThanOrEqual(1);

    expect(
      events
        .filter((e) => e.type === 'outcome')
        .map((e) => (e as { outcome: string }).outcome)
        .sort(),
    ).toEqual(['conflict', 'executed', 'executed', 'mismatch', 'replayed']);
    expect(events.some((e) => e.type === 'claim' && e.state === 'claimed')).toBe(true);
    expect(JSON.stringify(events)).not.toContain(key);
    expect(JSON.stringify(events)).not.toContain('tenant-secret');
  });

  it('a failure that keeps its key, a takeover and the lease it cost the slow original are told apart', async () => {
    events.length = 0;
    const label = t.fresh();
    // /boom always throws and keeps its key in flight for its lease.
    expect((await post(t.api.url, '/boom', { label }, `k-${label}`)).status).toBe(500);
    // /short-lease (600 ms, no heartbeat): a retry after the lease takes the slow original's key over.
    const slowLabel = `${label}-slow`;
    t.api.probe.delays.set(slowLabel, [1_200]);
    const slow = post(t.api.url, '/short-lease', { label: slowLabel }, `k-${slowLabel}`);
    for (let i = 0; i < 500 && t.api.probe.count(slowLabel) === 0; i++) await sleep(10);
    await sleep(700);
    expect((await post(t.api.url, '/short-lease', { label: slowLabel }, `k-${slowLabel}`)).status).toBe(201);
    expect((await slow).status).toBe(409);
    const outcomes = events.filter((e) => e.type === 'outcome') as Array<{ outcome: string; attempt?: number }>;
    expect(outcomes.map((e) => [e.outcome, e.attempt])).toEqual([
      ['kept', 1],
      ['takeover', 2],
      ['lease-lost', 1],
    ]);
  });
});
