import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';
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

/*
 * Two instances on one table, both with replayFromMemory: each remembers what
 * it completed and what it replayed from the database, so the other asks the
 * database once, and duplicates spread over both still make one effect.
 */
describe.each(ADAPTERS)('replays from memory on two instances over %s', (adapter) => {
  let a: TestApp;
  let b: TestApp;
  let db: pg.Client;
  let n = 0;
  const fresh = () => `${adapter}-two-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);

  beforeAll(async () => {
    const schema = await freshSchema(`memory_two_${adapter}`);
    await createTables(schema);
    a = await startTestApp(adapter, schema, { replayFromMemory: true });
    b = await startTestApp(adapter, schema, { replayFromMemory: true });
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await db?.end();
  });

  it('the other instance replays from the database once, then from memory too', async () => {
    const label = fresh();
    const first = await post(a.url, '/items', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    const fromDatabase = await post(b.url, '/items', { label }, `k-${label}`);
    expect(fromDatabase.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(fromDatabase.body, first.body)).toBe(0);
    // Deleted by hand: the completing instance answers from memory, and so does the one that replayed it from the
    // database (a database that had forgotten the key would have run the handler again).
    await db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    for (const app of [a, b]) {
      const fromMemory = await post(app.url, '/items', { label }, `k-${label}`);
      expect(fromMemory.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(fromMemory.body, first.body)).toBe(0);
    }
    expect(a.probe.count(label)).toBe(1);
    expect(b.probe.count(label)).toBe(0);
    expect(await effects(label)).toBe(1);
  });

  it('a request-transaction route too: the other instance replays from the database once, then from memory', async () => {
    const label = fresh();
    const first = await post(a.url, '/in-tx', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    const fromDatabase = await post(b.url, '/in-tx', { label }, `k-${label}`);
    expect(fromDatabase.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(fromDatabase.body, first.body)).toBe(0);
    await db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    for (const app of [a, b]) {
      const fromMemory = await post(app.url, '/in-tx', { label }, `k-${label}`);
      expect(fromMemory.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(fromMemory.body, first.body)).toBe(0);
    }
    expect(a.probe.count(label) + b.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('remembers a replay from the database no longer than its record lives, by the database clock', async () => {
    const label = fresh();
    await post(a.url, '/items', { label }, `k-${label}`);
    // The record has 1.5 s left: less than the margin a remembered answer keeps from its record's end.
    await db.query(`UPDATE idempotency_keys SET expires_at = now() + interval '1500 milliseconds' WHERE key = $1`, [
      `k-${label}`,
    ]);
    const fromDatabase = await post(b.url, '/items', { label }, `k-${label}`);
    expect(fromDatabase.headers['idempotent-replayed']).toBe('true');
    await db.query('DELETE FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    const rerun = await post(b.url, '/items', { label }, `k-${label}`);
    expect(rerun.status).toBe(201);
    expect(rerun.headers['idempotent-replayed']).toBeUndefined();
    expect(b.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(2);
  });

  it('a mismatch is 422 on either instance', async () => {
    const label = fresh();
    await post(a.url, '/items', { label }, `k-${label}`);
    for (const app of [a, b]) {
      const other = await post(app.url, '/items', { label, extra: true }, `k-${label}`);
      expect(other.status).toBe(422);
      expect(other.json()).toMatchObject({ type: ProblemType.mismatch });
    }
  });

  it('concurrent duplicates on both instances make one effect, and every success is the same bytes', async () => {
    for (let round = 0; round < 3; round++) {
      const label = fresh();
      const answers = await Promise.all(
        Array.from({ length: 16 }, (_, i) => post((i % 2 ? b : a).url, '/items', { label }, `k-${label}`)),
      );
      const successes = answers.filter((r) => r.status === 201);
      expect(successes.length).toBeGreaterThan(0);
      for (const r of answers) expect([201, 409]).toContain(r.status);
      for (const r of successes) expect(Buffer.compare(r.body, successes[0].body)).toBe(0);
      expect(await effects(label)).toBe(1);
      // Afterwards both answer it the same, from memory or the database.
      for (const app of [a, b]) {
        const later = await post(app.url, '/items', { label }, `k-${label}`);
        expect(later.headers['idempotent-replayed']).toBe('true');
        expect(Buffer.compare(later.body, successes[0].body)).toBe(0);
      }
    }
  });
});
