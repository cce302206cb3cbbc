import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { createTables, databaseUrl, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';
import { throughWireCounter, WireCounter } from './support/wire-counter.js';

const CLAIM = /nest-idempotency:claim \*\//;
const DUPLICATES = 20;

/**
 * Duplicates arriving at one instance while its claim of the same key and request is on its way to the database
 * wait for that claim's answer instead of sending their own (a retry storm costs one claim, not one per duplicate),
 * and get what their own claim would have got. The claim is held up deterministically: the test holds an ACCESS
 * EXCLUSIVE lock on the key table, so the first claim waits in the server while every duplicate arrives.
 */
describe.each(ADAPTERS)('duplicates of a claim on its way share its answer, over %s', (adapter) => {
  let app: TestApp;
  let other: TestApp;
  let wire: WireCounter;
  let db: pg.Client;
  let schema: string;
  let n = 0;
  const fresh = () => `${adapter}-share-${Date.now()}-${++n}`;
  const claimsSent = () => wire.summary().filter(({ statements }) => statements.some((text) => CLAIM.test(text))).length;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);

  /** Runs `send` while the key table is locked, so that every claim waits in the server until the lock goes. */
  async function whileKeyTableLocked<T>(
    send: () => Promise<T>[],
    meanwhile?: (lockerPid: number) => Promise<void>,
  ): Promise<T[]> {
    const locker = await sqlClient(schema);
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE');
      wire.reset();
      const answers = send();
      // Every request reaches the engine long before this; the lock keeps the first claim unanswered meanwhile.
      await sleep(400);
      await meanwhile?.((await locker.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0].pid);
      await locker.query('COMMIT');
      return await Promise.all(answers);
    } finally {
      await locker.end();
    }
  }

  beforeAll(async () => {
    schema = await freshSchema(`claims_shared_${adapter}`);
    await createTables(schema);
    const target = new URL(databaseUrl());
    wire = new WireCounter(Number(target.port || 5432), target.hostname);
    await wire.start();
    app = await startTestApp(adapter, schema, {}, { url: throughWireCounter(databaseUrl(), wire) });
    other = await startTestApp(adapter, schema);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await app?.close();
    await other?.close();
    await wire?.stop();
    await db?.end();
  });

  it('replays of a completed key: one claim for all of them, each the first answer byte for byte', async () => {
    const label = fresh();
    const first = await post(app.url, '/items-forgotten', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    const replays = await whileKeyTableLocked(() =>
      Array.from({ length: DUPLICATES }, () => post(app.url, '/items-forgotten', { label }, `k-${label}`)),
    );
    for (const replay of replays) {
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, first.body)).toBe(0);
    }
    expect(claimsSent()).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('a new key: one claim, one execution; the duplicates that waited for its claim answer 409 with Retry-After', async () => {
    const label = fresh();
    app.probe.delays.set(label, [300]);
    const answers = await whileKeyTableLocked(() =>
      Array.from({ length: DUPLICATES }, () => post(app.url, '/slow', { label }, `k-${label}`)),
    );
    const executed = answers.filter((answer) => answer.status === 201);
    const conflicts = answers.filter((answer) => answer.status === 409);
    expect(executed).toHaveLength(1);
    expect(executed[0].headers['idempotent-replayed']).toBeUndefined();
    expect(conflicts).toHaveLength(DUPLICATES - 1);
    for (const conflict of conflicts) {
      expect(conflict.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(Number(conflict.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    expect(claimsSent()).toBe(1);
    expect(app.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
    // Once it committed, a retry replays it.
    const replay = await post(app.url, '/slow', { label }, `k-${label}`);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(replay.body, executed[0].body)).toBe(0);
  });

  it('a shared claim whose connection dies: its sender answers 503, the duplicates that waited for it ask the database themselves and replay', async () => {
    const label = fresh();
    const first = await post(app.url, '/items-forgotten', { label }, `k-${label}`);
    const answers = await whileKeyTableLocked(
      () => Array.from({ length: 8 }, () => post(app.url, '/items-forgotten', { label }, `k-${label}`)),
      async (lockerPid) => {
        // The one claim waiting on this test's lock: its server process ends, as in a crash of that backend. (Only
        // the one this test's lock holds up: other test files share the database and may have claims waiting too.)
        const { rows } = await db.query<{ ended: boolean }>(
          `SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity
            WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%nest-idempotency:claim%'`,
          [lockerPid],
        );
        expect(rows).toEqual([{ ended: true }]);
        // The duplicates' own claims are sent (and wait on the lock) before it goes.
        await sleep(300);
      },
    );
    const statuses = answers.map((answer) => answer.status).sort();
    expect(statuses).toEqual([201, 201, 201, 201, 201, 201, 201, 503]);
    for (const replay of answers.filter((answer) => answer.status === 201)) {
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, first.body)).toBe(0);
    }
    // The dead claim, then one of each duplicate's own.
    expect(claimsSent()).toBe(8);
    expect(await effects(label)).toBe(1);
  });

  it('another request under the key shares nothing: 422 for each, while the same request replays', async () => {
    const label = fresh();
    const first = await post(app.url, '/items-forgotten', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    const answers = await whileKeyTableLocked(() =>
      Array.from({ length: 8 }, (_, i) =>
        post(app.url, '/items-forgotten', i % 2 ? { label, other: i } : { label }, `k-${label}`),
      ),
    );
    answers.forEach((answer, i) => {
      if (i % 2) expect(answer.status).toBe(422);
      else expect(Buffer.compare(answer.body, first.body)).toBe(0);
    });
    // Each other request sent a claim of its own; never more claims than requests.
    expect(claimsSent()).toBeGreaterThanOrEqual(4);
    expect(claimsSent()).toBeLessThanOrEqual(8);
    expect(await effects(label)).toBe(1);
  });

  it('another tenant under the same key shares nothing: each tenant executes once', async () => {
    const label = fresh();
    const answers = await whileKeyTableLocked(() =>
      Array.from({ length: 6 }, (_, i) =>
        post(app.url, '/items-forgotten', { label, tenant: 'x' }, `k-${label}`, i % 2 ? 'tenant-a' : 'tenant-b'),
      ),
    );
    const executed = answers.filter((answer) => answer.status === 201 && !answer.headers['idempotent-replayed']);
    expect(executed).toHaveLength(2);
    expect(answers.every((answer) => answer.status === 201 || answer.status === 409)).toBe(true);
    expect(claimsSent()).toBe(2);
    expect(await effects(label)).toBe(2);
  });

  it('a key held by another instance: the duplicates ask the database themselves, and replay once it completed', async () => {
    const label = fresh();
    other.probe.delays.set(label, [600]);
    const holder = post(other.url, '/slow', { label }, `k-${label}`);
    for (let i = 0; i < 300 && other.probe.count(label) === 0; i++) await sleep(10);
    // "In flight elsewhere" may be stale by the time it is answered: it is never shared. Each duplicate gets its own
    // answer from the database: 409 while the other instance runs it.
    const during = await whileKeyTableLocked(() =>
      Array.from({ length: 4 }, () => post(app.url, '/slow', { label }, `k-${label}`)),
    );
    expect(during.map((answer) => answer.status)).toEqual([409, 409, 409, 409]);
    expect(claimsSent()).toBe(4);
    const done = await holder;
    expect(done.status).toBe(201);
    const after = await post(app.url, '/slow', { label }, `k-${label}`);
    expect(after.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(after.body, done.body)).toBe(0);
    expect(other.probe.count(label) + app.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });
});
