import { describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

describe.each(ADAPTERS)('state table over %s', (adapter) => {
  const t = useApiSuite(adapter, 'state');

  it('absent key: claims and executes once, storing the response', async () => {
    const label = t.fresh();
    const res = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(res.status).toBe(201);
    expect(res.json()).toMatchObject({ label });
    expect(res.headers['idempotent-replayed']).toBeUndefined();
    expect(await t.effects(label)).toBe(1);
    const stored = await t.keyRow(`k-${label}`);
    expect(stored.status).toBe('completed');
    expect(stored.response_status).toBe(201);
    expect(Buffer.compare(stored.response_body, res.body)).toBe(0);
  });

  it('completed + same fingerprint: replays byte-for-byte without running the handler', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/items', { label, b: 1, a: 2 }, `k-${label}`);
    // Same JSON, keys reordered: the same request.
    const second = await post(t.api.url, '/items', { a: 2, label, b: 1 }, `k-${label}`);
    expect(second.status).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(second.body, first.body)).toBe(0);
    expect(second.headers['content-type']).toBe(first.headers['content-type']);
    expect(t.api.probe.count(label)).toBe(1);
    expect(await t.effects(label)).toBe(1);
  });

  it('completed + different fingerprint: 422 problem, nothing of the stored response leaks', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    const res = await post(t.api.url, '/items', { label, extra: true }, `k-${label}`);
    expect(res.status).toBe(422);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.json()).toMatchObject({ type: ProblemType.mismatch, status: 422 });
    expect(res.text()).not.toContain(label);
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('in flight with a valid lease + same fingerprint: 409 with Retry-After', async () => {
    const label = t.fresh();
    t.api.probe.delays.set(label, [1500]);
    const first = post(t.api.url, '/slow', { label }, `k-${label}`);
    await sleep(300);
    const second = await post(t.api.url, '/slow', { label }, `k-${label}`);
    expect(second.status).toBe(409);
    expect(second.json()).toMatchObject({ type: ProblemType.conflict, status: 409 });
    const retryAfter = Number(second.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(30);
    expect((await first).status).toBe(201);
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('in flight with a valid lease + different fingerprint: 422', async () => {
    const label = t.fresh();
    t.api.probe.delays.set(label, [1000]);
    const first = post(t.api.url, '/slow', { label }, `k-${label}`);
    await sleep(300);
    const second = await post(t.api.url, '/slow', { label, other: 1 }, `k-${label}`);
    expect(second.status).toBe(422);
    expect((await first).status).toBe(201);
  });

  it('in flight with an expired lease + same fingerprint: taken over with a new owner token and executed', async () => {
    const label = t.fresh();
    const failed = await post(t.api.url, '/boom', { label }, `k-${label}`);
    expect(failed.status).toBe(500);
    const before = await t.keyRow(`k-${label}`);
    expect(before.status).toBe('in_flight');
    await t.db.query(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' WHERE key = $1`, [`k-${label}`]);
    const again = await post(t.api.url, '/boom', { label }, `k-${label}`);
    expect(again.status).toBe(500);
    const after = await t.keyRow(`k-${label}`);
    expect(after.owner_token).not.toBe(before.owner_token);
    expect(after.attempt).toBe(2);
    expect(t.api.probe.count(label)).toBe(2);
    // Both attempts failed, so neither attempt's write survived.
    expect(await t.effects(label)).toBe(0);
  });

  it('in flight with an expired lease + different fingerprint: 422', async () => {
    const label = t.fresh();
    await post(t.api.url, '/boom', { label }, `k-${label}`);
    await t.db.query(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' WHERE key = $1`, [`k-${label}`]);
    const res = await post(t.api.url, '/boom', { label, changed: 1 }, `k-${label}`);
    expect(res.status).toBe(422);
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('expired past its TTL but not swept: absent, executes anew even with another body', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await t.db.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, [`k-${label}`]);
    const res = await post(t.api.url, '/items', { label, v: 2 }, `k-${label}`);
    expect(res.status).toBe(201);
    expect(res.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
    expect((await t.keyRow(`k-${label}`)).attempt).toBe(1);
  });

  it('expired by TTL yet in flight with a valid lease: still not absent (409)', async () => {
    const label = t.fresh();
    t.api.probe.delays.set(label, [1200]);
    const first = post(t.api.url, '/slow', { label }, `k-${label}`);
    await sleep(300);
    await t.db.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, [`k-${label}`]);
    const res = await post(t.api.url, '/slow', { label }, `k-${label}`);
    expect(res.status).toBe(409);
    await first;
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('keys are case-sensitive', async () => {
    const label = t.fresh();
    const a = await post(t.api.url, '/items', { label }, `Key-${label}`);
    const b = await post(t.api.url, '/items', { label }, `key-${label}`);
    expect(a.status).toBe(201);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
  });
});
