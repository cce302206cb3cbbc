import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { AppProcess } from './support/app-process.js';
import { createTables, freshSchema, installCommitJudge, sqlClient } from './support/database.js';
import { post, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const APP = 'test/support/drizzle-cls-app.ts';

/**
 * `@nestjs-cls/transactional` with its Drizzle adapter, and
 * `clsTransactionalDrizzle()` as the module's `transactionManager`
 * (test/support/drizzle-cls-app.ts, in a child process): the app's
 * `@Transactional()` methods, writing through `TransactionHost#tx`, run in the
 * module's transaction, the one that completes the key.
 */
describe.each(ADAPTERS)('@nestjs-cls/transactional’s Drizzle adapter joined over %s', (adapter: AdapterName) => {
  let app: AppProcess;
  let db: pg.Client;
  let n = 0;
  const fresh = (kind: string) => `${kind}-cls-drizzle-${adapter}-${Date.now()}-${++n}`;
  const count = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0] as
      { status: string } | undefined;

  let schema: string;
  const env = () => ({ APP_SCHEMA: schema, HTTP_ADAPTER: adapter });

  beforeAll(async () => {
    schema = await freshSchema(`drizzle_cls_${adapter}`);
    await createTables(schema);
    db = await sqlClient(schema);
    await installCommitJudge(db);
    app = await AppProcess.start(APP, env());
  });
  afterAll(async () => {
    await app?.stop();
    await db?.end();
  });

  it('runs a @Transactional() method in the module’s transaction, committed with the completed key, and replays it', async () => {
    const label = fresh('ok');
    const first = await post(app.url, '/transfers', { label }, `k-${label}`);
    const replay = await post(app.url, '/transfers', { label }, `k-${label}`);

    expect(first.status).toBe(201);
    expect(first.json().app).toBe(first.json().module);
    expect(await count(label)).toBe(1);
    expect((await keyRow(`k-${label}`))?.status).toBe('completed');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text()).toBe(first.text());
    expect(await count(label)).toBe(1);

    // Outside idempotent handlers nothing changes: the method opens and commits a transaction of its own.
    const plain = await post(app.url, '/plain-transfers', { label: `${label}-plain` }, undefined);
    expect(plain.status).toBe(201);
    expect(plain.json().app).not.toBe(first.json().app);
    expect(await count(`${label}-plain`)).toBe(1);
  });

  it('joins @Transactional() methods that call one another', async () => {
    const label = fresh('nested');
    const response = await post(app.url, '/nested-transfers', { label }, `k-${label}`);

    expect(response.status).toBe(201);
    const { app: inner, module } = response.json();
    expect(inner).toEqual([module, module]);
    expect(await count(label)).toBe(2);
  });

  it('opens a savepoint in the module’s transaction for Propagation.Nested: rolled back alone, the rest committed with the key', async () => {
    const label = fresh('savepoint');
    const response = await post(app.url, '/savepoint-transfers', { label }, `k-${label}`);

    expect(response.status).toBe(201);
    expect(response.json().app).toBe(response.json().module);
    expect(await count(label)).toBe(1);
    expect(await count(`${label}-undone`)).toBe(0);
    expect((await keyRow(`k-${label}`))?.status).toBe('completed');
  });

  it.each([
    ['separate', '/transfers'],
    ['request-transaction', '/transfers-in-tx'],
  ])(
    'rolls the method’s writes back when the handler fails after it (claim mode %s); the retry writes once',
    async (_mode, path) => {
      const label = fresh('fail');
      expect((await post(app.url, path, { label, fail: true }, `k-${label}`)).status).toBe(500);
      expect(await count(label)).toBe(0);
      expect((await keyRow(`k-${label}`))?.status).not.toBe('completed');

      const retry = await post(app.url, path, { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(await count(label)).toBe(1);
      expect((await keyRow(`k-${label}`))?.status).toBe('completed');
    },
  );

  it.each([
    ['separate', '/transfers'],
    ['request-transaction', '/transfers-in-tx'],
  ])(
    'answers a COMMIT the database refuses (claim mode %s): neither the completion nor the effect; a retry writes once',
    async (_mode, path) => {
      const label = fresh('refuse');
      await db.query('INSERT INTO refused_labels VALUES ($1)', [label]);
      const refused = await post(app.url, path, { label }, `k-${label}`);

      expect(refused.status).toBe(500);
      expect(refused.json().type).toBe(ProblemType.commitRefused);
      expect(await count(label)).toBe(0);
      expect((await keyRow(`k-${label}`))?.status).not.toBe('completed');

      await db.query('DELETE FROM refused_labels WHERE label = $1', [label]);
      const retry = await post(app.url, path, { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(await count(label)).toBe(1);
    },
  );

  it('loses the Drizzle writes with the process killed between the handler and the COMMIT; a retry runs once', async () => {
    const label = fresh('crash');
    const key = `k-${label}`;
    const dying = app;
    const lost = await post(dying.url, '/crashing-transfers', { label }, key).catch((error: Error) => error);
    expect(await dying.exit()).toBe('SIGKILL');
    // The answer never came: the connection died with the process.
    expect(lost).toHaveProperty('code', 'ECONNRESET');
    expect(await count(label)).toBe(0);
    expect((await keyRow(key))?.status).toBe('in_flight');

    // The same app, started again, whose crashing route no longer crashes; the crashed attempt's lease (1 s) must end.
    app = await AppProcess.start(APP, { ...env(), CRASH: '0' });
    let retry: RawResponse = await post(app.url, '/crashing-transfers', { label }, key);
    for (let i = 0; i < 100 && retry.status === 409; i++) {
      await sleep(250);
      retry = await post(app.url, '/crashing-transfers', { label }, key);
    }
    const replay = await post(app.url, '/crashing-transfers', { label }, key);

    expect(retry.status).toBe(201);
    expect(retry.json().app).toBe(retry.json().module);
    expect(await count(label)).toBe(1);
    expect((await keyRow(key))?.status).toBe('completed');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await count(label)).toBe(1);
  });
});

it('stops an app whose adapter manages no Drizzle database on node-postgres, with a message that says how to fix it', async () => {
  const schema = await freshSchema('drizzle_cls_misconfigured');
  await createTables(schema);
  const app = new AppProcess(APP, { APP_SCHEMA: schema, HTTP_ADAPTER: 'express', MISCONFIGURE: '1' });
  const line = await app.line(/^(listening \d+|failed )/);
  await app.stop();
  expect(line).toMatch(
    /^failed IdempotencyConfigurationError: clsTransactionalDrizzle\(\): the database given is not a Drizzle database on node-postgres/,
  );
});
