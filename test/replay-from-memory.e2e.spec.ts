import { describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

/*
 * Replays from memory (`replayFromMemory`). To tell a memory replay from a
 * database one, a test deletes the key's row after the first answer: a
 * replay from memory still answers with the stored bytes; one that asks the
 * database finds the key absent and runs the handler again (a second effect).
 */
describe.each(ADAPTERS)('replays from memory over %s', (adapter) => {
  const t = useApiSuite(adapter, 'memory_replay', { replayFromMemory: true, completedAnswers: { maxEntries: 3, window: '3s' } });

  const forgetInDatabase = (key: string) => t.db.query('DELETE FROM idempotency_keys WHERE key = $1', [key]);

  it('answers a retry of a key this instance completed with the same bytes, without the database', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    await forgetInDatabase(`k-${label}`);
    const again = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(again.body, first.body)).toBe(0);
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(t.api.probe.count(label)).toBe(1);
    expect(await t.effects(label)).toBe(1);
  });

  it('answers another request under the key 422, as the database would, leaking nothing', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await forgetInDatabase(`k-${label}`);
    const other = await post(t.api.url, '/items', { label, extra: true }, `k-${label}`);
    expect(other.status).toBe(422);
    expect(other.json()).toMatchObject({ type: ProblemType.mismatch, status: 422 });
    expect(other.text()).not.toContain(label);
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('never answers another tenant from memory', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`, 'tenant-a');
    const otherTenant = await post(t.api.url, '/items', { label }, `k-${label}`, 'tenant-b');
    expect(otherTenant.status).toBe(201);
    expect(otherTenant.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
  });

  it('answers concurrent retries of a completed key once each, with one effect', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/items', { label }, `k-${label}`);
    const retries = await Promise.all(Array.from({ length: 10 }, () => post(t.api.url, '/items', { label }, `k-${label}`)));
    for (const retry of retries) {
      expect(retry.status).toBe(201);
      expect(Buffer.compare(retry.body, first.body)).toBe(0);
    }
    expect(await t.effects(label)).toBe(1);
  });

  it('asks the database once the window has passed', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await sleep(3_200);
    await forgetInDatabase(`k-${label}`);
    const later = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(later.status).toBe(201);
    expect(later.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
  });

  it('keeps at most maxEntries answers, the oldest out first', async () => {
    const labels = [t.fresh(), t.fresh(), t.fresh(), t.fresh()];
    for (const label of labels) await post(t.api.url, '/items', { label }, `k-${label}`);
    for (const label of labels) await forgetInDatabase(`k-${label}`);
    // The first was pushed out by the fourth: the database decides, and the key is gone there.
    expect(
      (await post(t.api.url, '/items', { label: labels[0] }, `k-${labels[0]}`)).headers['idempotent-replayed'],
    ).toBeUndefined();
    expect((await post(t.api.url, '/items', { label: labels[3] }, `k-${labels[3]}`)).headers['idempotent-replayed']).toBe('true');
    expect(t.api.probe.count(labels[0])).toBe(2);
    expect(t.api.probe.count(labels[3])).toBe(1);
  });
});

describe.each(ADAPTERS)('replays from memory never outlive the record over %s', (adapter) => {
  // A TTL of 1.5 s leaves 1.5 s - (1 s + 1%) = 485 ms in memory, whatever the window.
  const t = useApiSuite(adapter, 'memory_ttl', { replayFromMemory: true, ttl: 1_500 });
  const forgetInDatabase = (key: string) => t.db.query('DELETE FROM idempotency_keys WHERE key = $1', [key]);

  it('runs the handler again once the record has expired, as the database says', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await sleep(1_700);
    const afterExpiry = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(afterExpiry.status).toBe(201);
    expect(afterExpiry.headers['idempotent-replayed']).toBeUndefined();
    expect(await t.effects(label)).toBe(2);
  });

  it('still replays from memory within the record’s life less the margin', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await forgetInDatabase(`k-${label}`);
    const soon = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(soon.headers['idempotent-replayed']).toBe('true');
    expect(await t.effects(label)).toBe(1);
  });
});

describe.each(ADAPTERS)('a route that opts out of replayFromMemory over %s', (adapter) => {
  const t = useApiSuite(adapter, 'memory_route_off', { replayFromMemory: true });

  it('asks the database for every replay, while the module keeps other routes’ answers', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items-forgotten', { label }, `k-${label}`);
    await t.db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    const again = await post(t.api.url, '/items-forgotten', { label }, `k-${label}`);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
  });
});

describe.each(ADAPTERS)('without replayFromMemory over %s', (adapter) => {
  const t = useApiSuite(adapter, 'memory_off');

  it('a route that opts in replays from memory', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items-remembered', { label }, `k-${label}`);
    await t.db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    const again = await post(t.api.url, '/items-remembered', { label }, `k-${label}`);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('every replay asks the database (the default)', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    await t.db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    const again = await post(t.api.url, '/items', { label }, `k-${label}`);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(2);
  });
});
