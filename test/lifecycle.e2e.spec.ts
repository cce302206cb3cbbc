import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { LoggerService } from '@nestjs/common';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

class CapturingLogger implements LoggerService {
  readonly warnings: string[] = [];
  log() {}
  error() {}
  warn(message: unknown) {
    this.warnings.push(String(message));
  }
  debug() {}
  verbose() {}
}

/**
 * The attempt lifecycle's order, seen from outside: nobody (the original, a
 * duplicate waiting in the same process, one in another process) is answered
 * with a success before its COMMIT has succeeded, and a COMMIT the database
 * refuses is the handler's failure.
 *
 * A deferred constraint trigger on the effect table decides at COMMIT: an
 * effect labelled `refuse-…` makes the COMMIT fail (as a deferred foreign key
 * or a serialization failure would), one labelled `slowcommit-…` makes it
 * take 600 ms.
 */
describe.each(ADAPTERS)('the attempt lifecycle over %s', (adapter) => {
  let one: TestApp;
  let two: TestApp;
  let db: pg.Client;
  const logs = new CapturingLogger();
  let n = 0;
  const fresh = (kind: string) => `${kind}-${adapter}-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0];
  /** Waits until `app`'s handler for `label` has started (so the key is claimed), however loaded the machine is. */
  const started = async (app: TestApp, label: string) => {
    for (let i = 0; i < 500 && app.probe.count(label) === 0; i++) await sleep(10);
    expect(app.probe.count(label)).toBeGreaterThan(0);
  };

  beforeAll(async () => {
    const schema = await freshSchema(`lifecycle_${adapter}`);
    await createTables(schema);
    db = await sqlClient(schema);
    await db.query(`CREATE FUNCTION judge_effect() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.label LIKE 'refuse-%' THEN
          RAISE EXCEPTION 'effect % refused at commit', NEW.id USING ERRCODE = '23514';
        END IF;
        IF NEW.label LIKE 'slowcommit-%' THEN PERFORM pg_sleep(0.6); END IF;
        RETURN NULL;
      END $$`);
    await db.query(`CREATE CONSTRAINT TRIGGER judge_effect AFTER INSERT ON effects
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION judge_effect()`);
    one = await startTestApp(adapter, schema, {}, { nestLogger: logs });
    two = await startTestApp(adapter, schema, {}, { nestLogger: logs });
  });
  afterAll(async () => {
    await one?.close();
    await two?.close();
    await db?.end();
  });

  describe.each([
    ['separate', '/waiting'],
    ['request-transaction', '/in-tx'],
  ])('claim mode %s with a wait', (mode, path) => {
    it('answers a COMMIT the database refuses as the handler failure, to the original and to a duplicate waiting in process', async () => {
      const label = fresh('refuse');
      one.probe.delays.set(label, [300]);
      const original = post(one.url, path, { label }, `k-${label}`);
      await started(one, label);
      const duplicate = await post(one.url, path, { label }, `k-${label}`);
      const first = await original;

      expect(first.status).toBe(500);
      expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(first.json().type).toBe(ProblemType.commitRefused);
      // Never the success the original's handler returned: its row does not exist.
      expect(duplicate.status).not.toBe(201);
      expect([409, 500]).toContain(duplicate.status);
      expect(await effects(label)).toBe(0);
      const row = await keyRow(`k-${label}`);
      // The default onError (keep) holds a separate claim until its lease ends; in request-transaction mode it rolled back.
      if (mode === 'separate') expect(row?.status).toBe('in_flight');
      else expect(row?.status).not.toBe('completed');
    });

    it('answers a duplicate waiting in process only once the original committed, as another connection sees it', async () => {
      const label = fresh('slowcommit');
      const original = post(one.url, path, { label }, `k-${label}`);
      await started(one, label);
      const duplicate = await post(one.url, path, { label }, `k-${label}`);
      // Read the moment the duplicate's answer arrived, before anything else can commit.
      const seenByOthers = { effects: await effects(label), key: (await keyRow(`k-${label}`))?.status };
      const first = await original;

      expect(first.status).toBe(201);
      expect(duplicate.status).toBe(201);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(duplicate.text()).toBe(first.text());
      expect(seenByOthers).toEqual({ effects: 1, key: 'completed' });
    });

    it('answers a duplicate in another process only once the original committed', async () => {
      const label = fresh('slowcommit');
      const original = post(one.url, path, { label }, `k-${label}`);
      await started(one, label);
      const duplicate = await post(two.url, path, { label }, `k-${label}`);
      const seenByOthers = { effects: await effects(label), key: (await keyRow(`k-${label}`))?.status };
      const first = await original;

      expect(first.status).toBe(201);
      expect(duplicate.status).toBe(201);
      expect(duplicate.text()).toBe(first.text());
      expect(seenByOthers).toEqual({ effects: 1, key: 'completed' });
    });
  });

  it('stores the commit-refused answer under onError: store, so every retry gets the same', async () => {
    const label = fresh('refuse');
    const first = await post(one.url, '/refused-stored', { label }, `k-${label}`);
    const retry = await post(two.url, '/refused-stored', { label }, `k-${label}`);

    expect(first.status).toBe(500);
    expect(first.json().type).toBe(ProblemType.commitRefused);
    expect(retry.status).toBe(500);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.text()).toBe(first.text());
    expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(0);
    expect((await keyRow(`k-${label}`)).status).toBe('completed');
  });

  it.each([
    ['separate', '/items'],
    ['request-transaction', '/in-tx'],
  ])('carries tenants and keys that SQL quoting must escape (claim mode %s), as literals never as SQL', async (_mode, path) => {
    const label = fresh('quoted');
    // Sent as literals in one message: quotes, backslashes and a statement terminator must stay data.
    const tenant = `o'brien\\"; DROP TABLE effects; -- é`;
    const key = `k'\\${label}";--`;
    const first = await post(one.url, path, { label }, key, tenant);
    const replay = await post(two.url, path, { label }, key, tenant);

    expect(first.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text()).toBe(first.text());
    expect(await effects(label)).toBe(1);
    const rows = (await db.query('SELECT tenant_id, key, status FROM idempotency_keys WHERE key = $1', [key])).rows;
    expect(rows).toEqual([{ tenant_id: tenant, key, status: 'completed' }]);
  });

  it('stops renewing a hung attempt at maxHold: a retry then takes the key over, and the hung attempt is fenced', async () => {
    const label = fresh('hung');
    // The first attempt hangs for 3 s; the lease (300 ms) is renewed only up to maxHold (900 ms).
    one.probe.delays.set(label, [3_000, 0]);
    const hung = post(one.url, '/hung', { label }, `k-${label}`);
    await started(one, label);
    await sleep(500);
    // Past one lease, but the heartbeat still holds it.
    const early = await post(two.url, '/hung', { label }, `k-${label}`);
    expect(early.status).toBe(409);
    let takeover = early;
    for (let i = 0; i < 60 && takeover.status === 409; i++) {
      await sleep(100);
      takeover = await post(two.url, '/hung', { label }, `k-${label}`);
    }
    expect(takeover.status).toBe(201);
    expect(takeover.json()).toMatchObject({ attempt: 1 });
    expect(two.probe.count(label)).toBe(1);
    const original = await hung;
    expect(original.status).toBe(409);
    expect(original.json().type).toBe(ProblemType.leaseLost);
    expect(await effects(label)).toBe(1);
    expect(logs.warnings.filter((line) => line.includes('maxHold'))).toHaveLength(1);
    expect(logs.warnings.join('\n')).not.toContain(`k-${label}`);
  });

  it('in request-transaction mode, a stored 4xx is final for a duplicate in another process waiting on the claim', async () => {
    const label = fresh('decline');
    one.probe.delays.set(label, [400]);
    const original = post(one.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
    await started(one, label);
    const duplicate = await post(two.url, '/in-tx', { label, fail: 'decline' }, `k-${label}`);
    const first = await original;

    expect(first.status).toBe(402);
    expect(duplicate.status).toBe(402);
    expect(duplicate.headers['idempotent-replayed']).toBe('true');
    expect(duplicate.text()).toBe(first.text());
    // The handler ran once: the duplicate never claimed the key in between.
    expect(one.probe.count(label) + two.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(0);
  });
});
