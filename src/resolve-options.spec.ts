import { describe, expect, it } from '@jest/globals';
import { IdempotencyConfigurationError } from './errors/configuration.error.js';
import { resolveIdempotencyOptions, resolveRouteOptions } from './resolve-options.js';

const tenant = () => 't';

describe('resolveIdempotencyOptions', () => {
  it('takes citus: true (default false), and refuses it with the partitioned key table, saying what to use', () => {
    expect(resolveIdempotencyOptions({ tenant }).citus).toBe(false);
    expect(resolveIdempotencyOptions({ tenant, citus: true }).citus).toBe(true);
    expect(() => resolveIdempotencyOptions({ tenant, citus: true, partitioned: true })).toThrow(IdempotencyConfigurationError);
    expect(() => resolveIdempotencyOptions({ tenant, citus: true, partitioned: true })).toThrow('use the plain key table');
  });

  it('fills the documented defaults', () => {
    const o = resolveIdempotencyOptions({ tenant });
    expect(o).toMatchObject({
      header: 'Idempotency-Key',
      required: true,
      ttlMs: 86_400_000,
      leaseMs: 30_000,
      maxKeyLength: 255,
      tableName: 'idempotency_keys',
      onHttpException: 'store',
      onError: 'keep',
      unavailableRetryAfter: 5,
      sweep: { scheduled: true, intervalMs: 60_000, batchSize: 250, maxDurationMs: 10_000, dutyCycle: 0.5 },
    });
    expect([...o.replayHeaders]).toEqual(['content-type', 'location', 'etag', 'content-location']);
  });

  it('keeps maxHold unset for ten of each route its lease, and inherits an explicit one', () => {
    const module = resolveIdempotencyOptions({ tenant, lease: '1s' });
    expect(module.maxHoldMs).toBeUndefined();
    const explicit = resolveIdempotencyOptions({ tenant, maxHold: '1m' });
    expect(resolveRouteOptions({ lease: '2s' }, explicit, 'route').maxHoldMs).toBe(60_000);
    expect(() => resolveRouteOptions({ lease: '2m' }, explicit, 'route')).toThrow(/maxHold/);
  });

  it("parses '30s'-style durations", () => {
    expect(resolveIdempotencyOptions({ tenant, ttl: '2h', lease: '45s' })).toMatchObject({ ttlMs: 7_200_000, leaseMs: 45_000 });
  });

  it.each([
    [{}, /`tenant` must be a function/],
    [{ tenant, ttl: 'soon' }, /ttl must be a positive whole number/],
    [{ tenant, lease: -1 }, /lease must be a positive/],
    [{ tenant, lease: '30' }, /lease must be .* a duration string with its unit/],
    [{ tenant, ttl: ' 100 ' }, /ttl must be .* a duration string with its unit/],
    [{ tenant, header: 'Bad Header' }, /`header` must be an HTTP header name/],
    [{ tenant, maxKeyLength: 0 }, /maxKeyLength/],
    [{ tenant, replayHeaders: ['Set-Cookie'] }, /never replayed/],
    [{ tenant, tableName: 'x; DROP TABLE y' }, /`tableName` must be a plain SQL identifier/],
    [{ tenant, onError: 'retry' }, /onError must be 'store', 'release' or 'keep'/],
    [{ tenant, lease: '10s', maxHold: '5s' }, /maxHold \(5000 ms\) is shorter than the lease \(10000 ms\)/],
    [{ tenant, sweep: { batchSize: 0 } }, /sweep.batchSize/],
    [{ tenant, sweep: { dutyCycle: 0 } }, /sweep.dutyCycle/],
    [{ tenant, sweep: { dutyCycle: 1.5 } }, /sweep.dutyCycle/],
  ])('refuses %j with a message that says how to fix it', (options, message) => {
    expect(() => resolveIdempotencyOptions(options as never)).toThrow(IdempotencyConfigurationError);
    expect(() => resolveIdempotencyOptions(options as never)).toThrow(message);
  });

  it('accepts a lease longer than the TTL: a key whose lease is valid never counts as expired (CONTRACT A4.10)', () => {
    expect(resolveIdempotencyOptions({ tenant, lease: '2h', ttl: '1h' })).toMatchObject({ leaseMs: 7_200_000, ttlMs: 3_600_000 });
    expect(resolveRouteOptions({ ttl: 100 }, resolveIdempotencyOptions({ tenant }), 'route')).toMatchObject({
      ttlMs: 100,
      leaseMs: 30_000,
    });
  });

  it("accepts unit strings with spaces and decimals: '1.5s', '500 ms'", () => {
    expect(resolveIdempotencyOptions({ tenant, lease: '1.5s', ttl: '500 ms' })).toMatchObject({ leaseMs: 1_500, ttlMs: 500 });
  });

  it('lets a route override the module and keeps the rest', () => {
    const module = resolveIdempotencyOptions({ tenant, lease: '10s', onHttpException: 'release' });
    expect(resolveRouteOptions({ ttl: '1h' }, module, 'route')).toMatchObject({
      ttlMs: 3_600_000,
      leaseMs: 10_000,
      onHttpException: 'release',
      required: true,
    });
  });

  it('bounds a stored response at 1 MiB unless the module or the route says otherwise', () => {
    expect(resolveIdempotencyOptions({ tenant }).maxResponseBytes).toBe(1_048_576);
    const module = resolveIdempotencyOptions({ tenant, maxResponseBytes: 64 * 1024 });
    expect(module.maxResponseBytes).toBe(65_536);
    expect(resolveRouteOptions({}, module, 'route').maxResponseBytes).toBe(65_536);
    expect(resolveRouteOptions({ maxResponseBytes: 10 * 1024 * 1024 }, module, 'route').maxResponseBytes).toBe(10_485_760);
  });

  it.each([0, -1, 1.5, '1mb', Number.POSITIVE_INFINITY])('refuses maxResponseBytes: %p, naming the option', (value) => {
    expect(() => resolveIdempotencyOptions({ tenant, maxResponseBytes: value as number })).toThrow(
      /^IdempotencyModule: maxResponseBytes must be a whole number of bytes/,
    );
    expect(() => resolveRouteOptions({ maxResponseBytes: value as number }, undefined, '@Idempotent() on A.b')).toThrow(
      /@Idempotent\(\) on A\.b: maxResponseBytes/,
    );
  });

  it('refuses an empty data source name when the module is defined', async () => {
    const { IdempotencyModule } = await import('./idempotency.module.js');
    expect(() => IdempotencyModule.forRoot({ tenant, dataSource: '' })).toThrow(/`dataSource` must be the non-empty name/);
  });

  it('accepts sweep: false: nothing is scheduled, on-demand sweeps keep the defaults', () => {
    expect(resolveIdempotencyOptions({ tenant, sweep: false }).sweep).toMatchObject({ scheduled: false, batchSize: 250 });
  });
});
