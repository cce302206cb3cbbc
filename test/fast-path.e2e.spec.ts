import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, QueryCounter, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { keyTableKind } from './support/key-table.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

/** The partitioned table claims with its own function (one live row per key across partitions) and completes that row. */
const oneWrite = keyTableKind() === 'plain';

/**
 * Two instances of the app on one schema, as two processes would be: each
 * has its own engine, so a duplicate sent to the other one goes through the
 * database rather than being answered in process.
 */
describe.each(ADAPTERS)('the fast path over %s: heartbeat, bounded wait, request-transaction mode', (adapter) => {
  let one: TestApp;
  let two: TestApp;
  let db: pg.Client;
  const counter = new QueryCounter();
  let n = 0;
  const fresh = () => `${adapter}-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  /** Waits until `app`'s handler for `label` has started (so the key is claimed), however loaded the machine is. */
  const started = async (app: TestApp, label: string) => {
    for (let i = 0; i < 500 && app.probe.count(label) === 0; i++) await sleep(10);
    expect(app.probe.count(label)).toBeGreaterThan(0);
  };
  const keyRow = async (key: string) =>
    (await db.query('SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0];

  beforeAll(async () => {
    const schema = await freshSchema(`fast_path_${adapter}`);
    await createTables(schema);
    one = await startTestApp(adapter, schema);
    two = await startTestApp(adapter, schema, {}, { logger: counter });
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await one?.close();
    await two?.close();
    await db?.end();
  });

  describe('lease heartbeat', () => {
    it('a live handler running five times its lease keeps its key: the other instance gets 409, never a takeover', async () => {
      const label = fresh();
      one.probe.delays.set(label, [2_000]);
      let finished = false;
      const original = post(one.url, '/long', { label }, `k-${label}`).then((res) => {
        finished = true;
        return res;
      });
      await started(one, label);
      const claimedAt = Date.now();
      const leaseAtStart = (await keyRow(`k-${label}`)).lease_expires_at as Date;
      // Past the 400 ms lease several times over: without the heartbeat each of these would take the key over.
      let latest409 = 0;
      while (!finished) {
        await sleep(250);
        const answer = await post(two.url, '/long', { label }, `k-${label}`);
        if (answer.status === 409) latest409 = Date.now() - claimedAt;
        else expect(answer.headers['idempotent-replayed']).toBe('true');
      }
      expect(latest409).toBeGreaterThan(1_000);
      expect(((await keyRow(`k-${label}`)).lease_expires_at as Date).getTime()).toBeGreaterThan(leaseAtStart.getTime());
      expect((await original).status).toBe(201);
      expect(two.probe.count(label)).toBe(0);
      expect(await effects(label)).toBe(1);
    });

    it('the heartbeat stops with the attempt: a key kept after a failure is taken over once its lease ends', async () => {
      const label = fresh();
      // /boom always throws, and keeps its key in flight for its 800 ms lease.
      expect((await post(one.url, '/boom', { label }, `k-${label}`)).status).toBe(500);
      expect((await post(two.url, '/boom', { label }, `k-${label}`)).status).toBe(409);
      await sleep(1_000);
      expect((await post(two.url, '/boom', { label }, `k-${label}`)).status).toBe(500);
      expect(two.probe.count(label)).toBe(1);
      expect((await keyRow(`k-${label}`)).attempt).toBe(2);
    });
  });

  describe('bounded wait', () => {
    it('a duplicate in the same process waits for the original and replays it, with no round trip', async () => {
      const label = fresh();
      two.probe.delays.set(label, [400]);
      const original = post(two.url, '/waiting', { label }, `k-${label}`);
      await started(two, label);
      counter.reset();
      const duplicate = await post(two.url, '/waiting', { label }, `k-${label}`);
      const first = await original;
      expect(first.status).toBe(201);
      expect(duplicate.status).toBe(201);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(duplicate.body, first.body)).toBe(0);
      // Only the original's own statements after the reset (its completion and COMMIT); none for the duplicate's claim.
      expect(counter.queries.filter((q) => q.includes('nest-idempotency:claim'))).toHaveLength(0);
      expect(await effects(label)).toBe(1);
    });

    it('a duplicate on another instance looks again until the original finishes, then replays it', async () => {
      const label = fresh();
      one.probe.delays.set(label, [600]);
      const original = post(one.url, '/waiting', { label }, `k-${label}`);
      await started(one, label);
      counter.reset();
      const duplicate = await post(two.url, '/waiting', { label }, `k-${label}`);
      expect(duplicate.status).toBe(201);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(duplicate.body, (await original).body)).toBe(0);
      // It looked more than once, each look one claim statement, and ran nothing.
      const looks = counter.queries.filter((q) => q.includes('nest-idempotency:claim')).length;
      expect(looks).toBeGreaterThan(1);
      expect(looks).toBeLessThan(20);
      expect(two.probe.count(label)).toBe(0);
      expect(await effects(label)).toBe(1);
    });

    it('the wait is bounded: past it the duplicate gets the 409', async () => {
      const label = fresh();
      one.probe.delays.set(label, [4_500]);
      const original = post(one.url, '/waiting', { label }, `k-${label}`);
      await started(one, label);
      const startedAt = Date.now();
      const duplicate = await post(two.url, '/waiting', { label }, `k-${label}`);
      expect(duplicate.status).toBe(409);
      expect(duplicate.json()).toMatchObject({ type: ProblemType.conflict });
      // It did wait (not an immediate 409), and gave up before the original finished.
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(2_500);
      expect((await original).status).toBe(201);
    });
  });

  describe("claim mode 'request-transaction'", () => {
    it("one transaction per new key, in the bare handler's three round trips: BEGIN + claim, handler, completion + COMMIT", async () => {
      const label = fresh();
      counter.reset();
      const first = await post(two.url, '/in-tx', { label }, `k-${label}`);
      expect(first.status).toBe(201);
      expect(counter.roundTrips).toEqual([
        [
          'START TRANSACTION',
          expect.stringMatching(
            oneWrite
              ? /^\/\* nest-idempotency:claim \*\/ SELECT \* FROM .*_claim_in_transaction"\(\$1, \$2, \$3, \$4::uuid, \$5, \$6, \$7\)$/
              : /^\/\* nest-idempotency:claim \*\/ SELECT \* FROM .*_claim"\(\$1, \$2, \$3, \$4::uuid, \$5, \$6, \$7\)$/,
          ),
          // The plain table's claim holds the key for its session too, so a stored failure needs no savepoint; the
          // partitioned table's claim writes its in-flight row in the transaction and keeps one.
          ...(oneWrite ? [] : ['SAVEPOINT nest_idempotency_work']),
        ],
        [expect.stringMatching(/^INSERT INTO effects/)],
        [
          expect.stringMatching(
            oneWrite
              ? /^\/\* nest-idempotency:complete \*\/ SELECT .*_complete_in_transaction"\(\$1, .*\) AS completed$/
              : /^\/\* nest-idempotency:complete \*\/ SELECT .*_complete_or_raise"\(\$1, .*\) AS completed$/,
          ),
          'COMMIT',
        ],
      ]);
      // No value of the request (its key, tenant, owner token or body) is in any statement's text.
      expect(counter.queries.join('\n')).not.toContain(label);
      const replay = await post(two.url, '/in-tx', { label }, `k-${label}`);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, first.body)).toBe(0);
      expect(await effects(label)).toBe(1);
    });

    it('a stored 4xx: BEGIN + claim, handler, the rollback that keeps the claim, completion + COMMIT', async () => {
      const label = fresh();
      counter.reset();
      const declined = await post(two.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
      expect(declined.status).toBe(402);
      const claim = expect.stringMatching(/^\/\* nest-idempotency:claim \*\//);
      const completion = expect.stringMatching(/^\/\* nest-idempotency:complete \*\//);
      // The statements in order (how the counter groups them into round trips depends on the adapter's scheduling
      // here). The plain table: the claim holds the key for its session, the work rolls back whole and the chained
      // transaction stores the answer. The partitioned table: back to the savepoint after the claim.
      expect(counter.queries).toEqual(
        oneWrite
          ? [
              'START TRANSACTION',
              claim,
              expect.stringMatching(/^INSERT INTO effects/),
              'ROLLBACK AND CHAIN',
              completion,
              'COMMIT',
            ]
          : [
              'START TRANSACTION',
              claim,
              'SAVEPOINT nest_idempotency_work',
              expect.stringMatching(/^INSERT INTO effects/),
              'ROLLBACK TO SAVEPOINT nest_idempotency_work',
              completion,
              'COMMIT',
            ],
      );
      expect(await effects(label)).toBe(0);
    });

    it('a handler that caught its own SQL error and answered: its COMMIT is refused, and the key is let go of before the connection is idle', async () => {
      const label = fresh();
      counter.reset();
      const answered = await post(two.url, '/in-tx', { label, fail: 'sql-swallowed' }, `k-${label}`);
      expect(answered.status).toBe(500);
      expect(await keyRow(`k-${label}`)).toBeUndefined();
      if (!oneWrite) return;
      // The failed transaction can only roll back: the release of the session's hold goes in the completion's message.
      expect(counter.queries).toEqual([
        'START TRANSACTION',
        expect.stringMatching(/^\/\* nest-idempotency:claim \*\//),
        expect.stringMatching(/^INSERT INTO effects/),
        'SELECT 1 / 0',
        expect.stringMatching(/^\/\* nest-idempotency:complete \*\//),
        'ROLLBACK AND CHAIN',
        expect.stringMatching(/^\/\* nest-idempotency:release-key \*\/ SELECT pg_advisory_unlock\(/),
        'ROLLBACK',
      ]);
    });

    it('writes a new key once on the plain table, completed: not even its own transaction sees an in-flight row', async () => {
      const label = fresh();
      const first = await post(two.url, '/in-tx-own-row', { label }, `k-${label}`);
      expect(first.status).toBe(201);
      // On the plain table the claim wrote nothing; the partitioned table's claim writes the in-flight row.
      expect(first.json()).toEqual({ rowsSeenByHandler: oneWrite ? 0 : 1 });
      expect((await keyRow(`k-${label}`)).status).toBe('completed');
      const replay = await post(one.url, '/in-tx-own-row', { label }, `k-${label}`);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.text()).toBe(first.text());
    });

    it('a duplicate on another instance waits on the key, then replays what committed', async () => {
      const label = fresh();
      one.probe.delays.set(label, [500]);
      const original = post(one.url, '/in-tx', { label }, `k-${label}`);
      await started(one, label);
      // Nothing is visible before the commit.
      expect(await keyRow(`k-${label}`)).toBeUndefined();
      const duplicate = await post(two.url, '/in-tx', { label }, `k-${label}`);
      expect(duplicate.status).toBe(201);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(duplicate.body, (await original).body)).toBe(0);
      expect(two.probe.count(label)).toBe(0);
      expect(await effects(label)).toBe(1);
    });

    it('a handler failure rolls the claim back with its writes: the key is free at once', async () => {
      const label = fresh();
      const failed = await post(one.url, '/in-tx', { label, fail: 'boom' }, `k-${label}`);
      expect(failed.status).toBe(500);
      expect(await keyRow(`k-${label}`)).toBeUndefined();
      expect(await effects(label)).toBe(0);
      const retry = await post(two.url, '/in-tx', { label, fail: 'boom' }, `k-${label}`);
      expect(retry.status).toBe(500);
      expect(two.probe.count(label)).toBe(1);
    });

    it('a 4xx from the handler is stored and replayed; its writes roll back', async () => {
      const label = fresh();
      const declined = await post(one.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
      expect(declined.status).toBe(402);
      const replay = await post(two.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
      expect(replay.status).toBe(402);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, declined.body)).toBe(0);
      expect(await effects(label)).toBe(0);
      expect((await keyRow(`k-${label}`)).status).toBe('completed');
    });

    it("the claim's lock timeout does not outlive the claim: the handler runs with the app's own", async () => {
      const res = await post(two.url, '/in-tx-settings', {}, `k-${fresh()}`);
      expect(res.status).toBe(201);
      expect(res.json()).toEqual({ lockTimeout: '0' });
    });

    it('a duplicate that waits longer than `wait` on the row lock gets a 409', async () => {
      const label = fresh();
      one.probe.delays.set(label, [4_500]);
      const original = post(one.url, '/in-tx', { label }, `k-${label}`);
      await started(one, label);
      const duplicate = await post(two.url, '/in-tx', { label }, `k-${label}`);
      expect(duplicate.status).toBe(409);
      expect((await original).status).toBe(201);
      expect(await effects(label)).toBe(1);
    });
  });

  it('50 concurrent duplicates in one process: one execution, every answer a 409 or a byte-identical replay', async () => {
    const label = fresh();
    one.probe.delays.set(label, [200]);
    const answers = await Promise.all(Array.from({ length: 50 }, () => post(one.url, '/slow', { label }, `k-${label}`)));
    const executed = answers.filter((a) => a.status === 201 && a.headers['idempotent-replayed'] === undefined);
    expect(executed).toHaveLength(1);
    for (const answer of answers) {
      if (answer.status === 409) expect(Number(answer.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      else expect(Buffer.compare(answer.body, executed[0].body)).toBe(0);
    }
    expect(one.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });
});
