import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { createTables, databaseUrl, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { TcpProxy, throughProxy } from './support/tcp-proxy.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

describe.each(ADAPTERS)('concurrency and faults over %s', (adapter) => {
  const t = useApiSuite(adapter, 'concurrency');

  it('50 concurrent identical requests execute once; the rest get 409 or the same response', async () => {
    const label = t.fresh();
    t.api.probe.delays.set(label, [300]);
    const responses = await Promise.all(Array.from({ length: 50 }, () => post(t.api.url, '/slow', { label }, `k-${label}`)));
    const originals = responses.filter((r) => r.status === 201 && !r.headers['idempotent-replayed']);
    const replays = responses.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === 'true');
    const conflicts = responses.filter((r) => r.status === 409);
    expect(originals).toHaveLength(1);
    expect(replays.length + conflicts.length).toBe(49);
    for (const r of replays) expect(Buffer.compare(r.body, originals[0].body)).toBe(0);
    for (const r of conflicts) {
      expect(r.json().type).toBe(ProblemType.conflict);
      expect(Number(r.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    expect(t.api.probe.count(label)).toBe(1);
    expect(await t.effects(label)).toBe(1);
  });

  it('50 concurrent requests with distinct keys all execute, each once', async () => {
    const label = t.fresh();
    const responses = await Promise.all(
      Array.from({ length: 50 }, (_, i) => post(t.api.url, '/items', { label }, `k-${label}-${i}`)),
    );
    expect(responses.every((r) => r.status === 201 && !r.headers['idempotent-replayed'])).toBe(true);
    expect(await t.effects(label)).toBe(50);
  });

  it("a handler that outlives its lease is rolled back after a takeover: one effect, the new attempt's", async () => {
    const label = t.fresh();
    // First attempt sleeps well past the 600 ms lease; the takeover is fast.
    t.api.probe.delays.set(label, [1800, 0]);
    const slow = post(t.api.url, '/short-lease', { label }, `k-${label}`);
    await sleep(900);
    const takeover = await post(t.api.url, '/short-lease', { label }, `k-${label}`);
    expect(takeover.status).toBe(201);
    expect(takeover.json()).toMatchObject({ attempt: 2 });
    const original = await slow;
    expect(original.status).toBe(409);
    expect(original.json()).toMatchObject({ type: ProblemType.leaseLost });
    expect(t.api.probe.count(label)).toBe(2);
    expect(await t.effects(label)).toBe(1);
    const later = await post(t.api.url, '/short-lease', { label }, `k-${label}`);
    expect(later.text()).toBe(takeover.text());
    expect(later.headers['idempotent-replayed']).toBe('true');
  });
});

describe.each(ADAPTERS)('database unreachable over %s', (adapter) => {
  let api: TestApp;
  let proxy: TcpProxy;
  let schema: string;

  beforeAll(async () => {
    schema = await freshSchema(`down_${adapter}`);
    await createTables(schema);
    const target = new URL(databaseUrl());
    proxy = new TcpProxy(Number(target.port || 5432), target.hostname);
    await proxy.start();
    api = await startTestApp(adapter, schema, {}, { url: throughProxy(databaseUrl(), proxy) });
  });
  afterAll(async () => {
    await proxy.restore();
    await api?.close();
    await proxy.cut();
  });

  it('answers 503 with Retry-After and does not run the handler; recovers when the database is back', async () => {
    const label = `${adapter}-down`;
    expect((await post(api.url, '/items', { label: `${label}-warm` }, `warm-${adapter}`)).status).toBe(201);
    await proxy.cut();
    const down = await post(api.url, '/items', { label }, `k-${label}`);
    expect(down.status).toBe(503);
    expect(down.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(down.json()).toMatchObject({
      type: ProblemType.unavailable,
      status: 503,
      detail: expect.stringMatching(/not processed/),
    });
    // Nothing was claimed, so the key is free as soon as the store is back: the module's `unavailableRetryAfter` (5 s).
    expect(down.headers['retry-after']).toBe('5');
    expect(api.probe.count(label)).toBe(0);

    await proxy.restore();
    const up = await post(api.url, '/items', { label }, `k-${label}`);
    expect(up.status).toBe(201);
    expect(api.probe.count(label)).toBe(1);
  });

  it('a connection lost with the claim: 503 saying nothing ran, nothing claimed, a retry runs at once', async () => {
    const label = `${adapter}-claim-lost`;
    proxy.dropConnectionOn('nest-idempotency:claim');
    const lost = await post(api.url, '/items', { label }, `k-${label}`);
    expect(lost.status).toBe(503);
    expect(lost.json()).toMatchObject({ type: ProblemType.unavailable, detail: expect.stringMatching(/not processed/) });
    expect(lost.headers['retry-after']).toBe('5');
    expect(api.probe.count(label)).toBe(0);
    const retry = await post(api.url, '/items', { label }, `k-${label}`);
    expect(retry.status).toBe(201);
    expect(api.probe.count(label)).toBe(1);
  });

  it("a connection lost at the work's BEGIN (sent with its first statement): nothing ran outside a transaction, the lease ended, a retry writes once", async () => {
    const label = `${adapter}-begin`;
    proxy.dropConnectionOn('START TRANSACTION');
    const lost = await post(api.url, '/items', { label }, `k-${label}`);
    expect(lost.status).toBe(503);
    // The handler had started (it may have used its claim's generation): the outcome is unknown to the client.
    expect(lost.json()).toMatchObject({ type: ProblemType.unavailable, detail: expect.stringMatching(/unknown/) });
    expect(api.probe.count(label)).toBe(1);
    const check = await sqlClient(schema);
    try {
      // The statement that carried the BEGIN never ran; the claim's row stays, its history kept, its lease ended.
      expect((await check.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count).toBe('0');
      const { rows } = await check.query(
        'SELECT status, generation::text, lease_expires_at <= now() AS ended FROM idempotency_keys WHERE key = $1',
        [`k-${label}`],
      );
      expect(rows).toEqual([{ status: 'in_flight', generation: expect.any(String), ended: true }]);
      const retry = await post(api.url, '/items', { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(api.probe.count(label)).toBe(2);
      expect((await check.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count).toBe('1');
      // The retry took the claim over: the same generation, so downstream keys derived from it are the same.
      const after = await check.query('SELECT generation::text, attempt FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
      expect(after.rows[0]).toEqual({ generation: rows[0].generation, attempt: 2 });
    } finally {
      await check.end();
    }
  });

  it('a connection lost while the handler runs answers 503, commits nothing, and a retry after the lease succeeds once', async () => {
    const label = `${adapter}-lost`;
    api.probe.delays.set(label, [1000]);
    const pending = post(api.url, '/short-lease', { label }, `k-${label}`);
    await sleep(300);
    await proxy.cut();
    const lost = await pending;
    expect(lost.status).toBe(503);
    expect(lost.json()).toMatchObject({ type: ProblemType.unavailable, detail: expect.stringMatching(/unknown/) });
    // The claim is held until its lease (600 ms) ends, and that is when a retry can take it over.
    expect(lost.headers['retry-after']).toBe('1');
    await proxy.restore();
    const check = await sqlClient(schema);
    try {
      expect((await check.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count).toBe('0');
      await sleep(700); // the route's lease is 600 ms
      const retry = await post(api.url, '/short-lease', { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect((await check.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count).toBe('1');
    } finally {
      await check.end();
    }
  });
});
