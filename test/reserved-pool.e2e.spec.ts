import { afterEach, describe, expect, it } from '@jest/globals';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

/** Resolves once `count` keys of `label`'s slow requests are in flight in the database. */
async function inFlight(schema: string, keys: string[]): Promise<void> {
  const db = await sqlClient(schema);
  try {
    for (let i = 0; i < 200; i++) {
      const { rows } = await db.query(
        `SELECT count(*)::int AS n FROM idempotency_keys WHERE key = ANY($1) AND status = 'in_flight'`,
        [keys],
      );
      if (rows[0].n === keys.length) return;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error('the slow requests never got in flight');
  } finally {
    await db.end();
  }
}

describe.each(ADAPTERS)('claims out of the business pool over %s', (adapter) => {
  let api: TestApp | undefined;
  afterEach(async () => {
    await api?.close();
    api = undefined;
  });

  /**
   * Slow handlers hold every connection of a business pool of two; then a
   * replay and a duplicate of a running key arrive. Returns the order in which
   * things finished.
   */
  async function saturate(reservedConnections: number): Promise<string[]> {
    const schema = await freshSchema(`reserved_${adapter}_${reservedConnections}`);
    await createTables(schema);
    api = await startTestApp(adapter, schema, { reservedConnections }, { poolSize: 2 });
    const run = `${adapter}-${reservedConnections}-${Date.now()}`;
    expect((await post(api.url, '/items', { label: `${run}-done` }, `${run}-done`)).status).toBe(201);

    const finished: string[] = [];
    const slowKeys = [`${run}-slow-1`, `${run}-slow-2`];
    for (const key of slowKeys) api.probe.delays.set(key, [1_500]);
    const slow = slowKeys.map((key) =>
      post(api!.url, '/slow', { label: key }, key).then((res) => {
        finished.push(`slow ${res.status}`);
      }),
    );
    await inFlight(schema, slowKeys);
    // The pool is stalled once even the attempt opened last has held its connection past 10 ms (the store's rule for
    // sending claims to the claim pool): on a loaded machine the second attempt can open just after its row shows.
    await sleep(100);
    const replay = post(api.url, '/items', { label: `${run}-done` }, `${run}-done`).then((res) => {
      expect(res.headers['idempotent-replayed']).toBe('true');
      finished.push('replay');
    });
    const duplicate = post(api.url, '/slow', { label: slowKeys[0] }, slowKeys[0]).then((res) => {
      finished.push(res.status === 409 ? '409' : `duplicate ${res.status}`);
    });
    await Promise.all([...slow, replay, duplicate]);
    return finished;
  }

  it('with reserved connections (the default), a replay and a 409 are answered while slow handlers hold the pool', async () => {
    const finished = await saturate(2);
    expect(finished.slice(0, 2).sort()).toEqual(['409', 'replay']);
    expect(finished.slice(2)).toEqual(['slow 201', 'slow 201']);
  });

  it('sharing the pool (reservedConnections: 0), they wait behind the slow handlers', async () => {
    const finished = await saturate(0);
    expect(finished.indexOf('replay')).toBeGreaterThan(finished.indexOf('slow 201'));
  });
});
