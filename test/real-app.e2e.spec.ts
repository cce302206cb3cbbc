import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { send, type RawResponse } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { SHOP_TENANT, startRealApp, type RealApp } from './real-app/app.js';
import { EFFECT_KINDS } from './real-app/controllers.js';

/**
 * Headers that differ between any two responses of the same app by design:
 * the date, the app's per-request id and the connection's own headers.
 */
const PER_RESPONSE = new Set(['date', 'x-request-id', 'connection', 'keep-alive']);
/** On a replay, also the one header the module adds. */
const PER_REPLAY = new Set([...PER_RESPONSE, 'idempotent-replayed']);

/**
 * Every header as received, in order, names as the server spelled them (a replay must not change a
 * name's case or its place), values untouched, duplicates kept.
 */
function wireHeaders(res: RawResponse, ignore: ReadonlySet<string>): Array<[string, string]> {
  const raw = res.rawHeaders ?? [];
  const pairs: Array<[string, string]> = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (!ignore.has(raw[i].toLowerCase())) pairs.push([raw[i], raw[i + 1]]);
  }
  return pairs;
}

function expectSameAnswer(actual: RawResponse, expected: RawResponse, ignore: ReadonlySet<string> = PER_RESPONSE): void {
  expect({ status: actual.status, headers: wireHeaders(actual, ignore), body: actual.text() }).toEqual({
    status: expected.status,
    headers: wireHeaders(expected, ignore),
    body: expected.text(),
  });
  expect(Buffer.compare(actual.body, expected.body)).toBe(0);
}

/** A replay: the first response byte for byte, plus `Idempotent-Replayed: true`. */
function expectReplayOf(replay: RawResponse, first: RawResponse): void {
  expect(first.headers['idempotent-replayed']).toBeUndefined();
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expectSameAnswer(replay, first, PER_REPLAY);
}

function expectProblem(res: RawResponse, status: number, type: string): void {
  expect(res.status).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  expect(res.json()).toMatchObject({ type, status, title: expect.any(String), detail: expect.any(String) });
}

describe.each(ADAPTERS)('a real application over %s: the module changes nothing it answers', (adapter) => {
  let plain: RealApp;
  let shop: RealApp;
  let plainDb: pg.Client;
  let shopDb: pg.Client;
  let n = 0;
  const fresh = () => `${adapter}-${Date.now()}-${++n}`;
  /** Every key and body marker sent in this file: none may ever appear in a log. */
  const secrets = new Set<string>();
  const newKey = () => {
    const key = `idem-${randomUUID()}`;
    secrets.add(key);
    return key;
  };
  const newMarker = () => {
    const marker = `body-marker-${randomUUID()}`;
    secrets.add(marker);
    return marker;
  };

  beforeAll(async () => {
    const plainSchema = await freshSchema(`real_app_plain_${adapter}`);
    const shopSchema = await freshSchema(`real_app_module_${adapter}`);
    await Promise.all([createTables(plainSchema), createTables(shopSchema)]);
    [plain, shop] = await Promise.all([startRealApp(adapter, plainSchema, false), startRealApp(adapter, shopSchema, true)]);
    [plainDb, shopDb] = await Promise.all([sqlClient(plainSchema), sqlClient(shopSchema)]);
  });

  afterAll(async () => {
    await Promise.all([plain?.close(), shop?.close(), plainDb?.end(), shopDb?.end()]);
  });

  const effects = async (db: pg.Client, kind: string, label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE tenant = $1 AND label = $2', [kind, label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await shopDb.query('SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', [SHOP_TENANT, key])).rows[0];

  /** One POST with a key, as JSON (`body`) or as raw text (`rawBody`). */
  const postTo = (app: RealApp, path: string, key: string, body: { body?: unknown; rawBody?: string }) =>
    send(app.url, 'POST', path, { headers: [['Idempotency-Key', key]], ...body });

  /**
   * The same request to the app without the module, then to the app with it,
   * then again to the app with it (the retry), all under one new key.
   */
  async function exchange(path: string, body: { body?: unknown; rawBody?: string }, key = newKey()) {
    const without = await postTo(plain, path, key, body);
    const first = await postTo(shop, path, key, body);
    const retry = await postTo(shop, path, key, body);
    return { key, without, first, retry };
  }

  it('a charge (201, Location, a class instance with an @Exclude()d field) answers and replays what the app answers alone', async () => {
    const label = fresh();
    const marker = newMarker();
    const { key, without, first, retry } = await exchange('/charges', { body: { label, amount: 1250, description: marker } });

    expect(without.status).toBe(201);
    expect(without.json()).toEqual({
      data: {
        id: `ch_${label}`,
        object: 'charge',
        amount: 1250,
        currency: 'usd',
        description: marker,
        amountDisplay: '12.50 USD',
      },
    });
    expect(without.headers.location).toBe(`/charges/ch_${label}`);
    expect(without.headers['x-request-id']).toEqual(expect.any(String));
    expectSameAnswer(first, without);
    expect(first.headers['x-request-id']).toEqual(expect.any(String));
    expectReplayOf(retry, first);

    for (const res of [without, first, retry]) expect(res.text()).not.toContain('riskScore');
    const row = await keyRow(key);
    expect(row).toMatchObject({ status: 'completed', response_status: 201 });
    expect(row.response_body.toString('utf8')).not.toContain('riskScore');
    expect(Buffer.compare(row.response_body, first.body)).toBe(0);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
    expect(await effects(shopDb, EFFECT_KINDS.provider, label)).toBe(1);
  });

  it('a route with parameters: replayed for the same parameter, 422 for another', async () => {
    const label = fresh();
    const { key, without, first, retry } = await exchange('/charges/ch_a1/refunds', { body: { label } });
    expect(without.status).toBe(201);
    expect(without.json()).toEqual({ data: { id: `re_${label}`, object: 'refund', charge: 'ch_a1' } });
    expectSameAnswer(first, without);
    expectReplayOf(retry, first);

    const other = await postTo(shop, '/charges/ch_b2/refunds', key, { body: { label } });
    expectProblem(other, 422, ProblemType.mismatch);
    expect(other.text()).not.toContain(label);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
  });

  it('a string in the envelope (JSON) answers and replays what the app answers alone', async () => {
    const label = fresh();
    const { without, first, retry } = await exchange('/notes', { body: { label } });
    expect(without.status).toBe(201);
    expect(without.json()).toEqual({ data: `Saved note ${label} ✓` });
    expectSameAnswer(first, without);
    expectReplayOf(retry, first);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
  });

  it('a string outside the envelope (text) answers and replays what the app answers alone', async () => {
    const label = fresh();
    const { without, first, retry } = await exchange('/notes/plain', { body: { label } });
    expect(without.status).toBe(201);
    expect(without.text()).toBe(`Saved note ${label} ✓`);
    expect(without.headers['content-type']).toMatch(/^text\//);
    expectSameAnswer(first, without);
    expectReplayOf(retry, first);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
  });

  it("a 402 from the handler (its cause an ECONNRESET) is stored in the app filter's shape and replayed as such", async () => {
    const label = fresh();
    const { key, without, first, retry } = await exchange('/charges/declined', { body: { label } });
    expect(without.status).toBe(402);
    expect(without.json()).toEqual({ error: { status: 402, message: 'Your card was declined.' }, path: '/charges/declined' });
    expectSameAnswer(first, without);
    expectReplayOf(retry, first);

    const row = await keyRow(key);
    expect(row).toMatchObject({ status: 'completed', response_status: 402 });
    expect(Buffer.compare(row.response_body, first.body)).toBe(0);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(0); // the handler's writes rolled back
    expect(await effects(shopDb, EFFECT_KINDS.provider, label)).toBe(1); // and the provider was not called again
  });

  it.each([
    ['an Error with code ECONNRESET', '/charges/provider-reset'],
    ['an Error whose cause has code ETIMEDOUT', '/charges/provider-timeout'],
  ])("%s is the handler's 500, as the app answers it alone; the key stays in flight", async (_what, path) => {
    const label = fresh();
    const { key, without, first, retry } = await exchange(path, { body: { label } });
    expect(without.status).toBe(500);
    expect(without.json()).toEqual({ error: { status: 500, message: 'Internal server error' }, path });
    expectSameAnswer(first, without);

    expectProblem(retry, 409, ProblemType.conflict);
    expect(Number(retry.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    const row = await keyRow(key);
    expect(row).toMatchObject({ status: 'in_flight', response_body: null });
    expect(await effects(shopDb, EFFECT_KINDS.provider, label)).toBe(1);
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(0);
  });

  it.each([
    ['a 504 GatewayTimeoutException', '/charges/gateway-timeout', 504, 'The payment provider did not answer in time.'],
    ['a 503 ServiceUnavailableException', '/charges/provider-down', 503, 'Payments are paused for maintenance.'],
  ])(
    '%s from the handler answers as the app alone does, is not stored, and keeps the key in flight',
    async (_what, path, status, message) => {
      const label = fresh();
      const { key, without, first, retry } = await exchange(path, { body: { label } });
      expect(without.status).toBe(status);
      expect(without.json()).toEqual({ error: { status, message }, path });
      expectSameAnswer(first, without);

      expectProblem(retry, 409, ProblemType.conflict);
      expect(await keyRow(key)).toMatchObject({ status: 'in_flight', response_status: null, response_body: null });
      expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(0);
    },
  );

  it('a body the validation pipe rejects answers as the app alone does and releases the key', async () => {
    const label = fresh();
    const { key, without, first, retry } = await exchange('/charges', { body: { label, amount: 'a lot' } });
    expect(without.status).toBe(400);
    expect(without.json()).toMatchObject({ error: { status: 400 }, path: '/charges' });
    expectSameAnswer(first, without);
    expectSameAnswer(retry, without); // released: the retry ran (and was rejected) again, nothing replayed
    expect(await keyRow(key)).toBeUndefined();

    const corrected = await postTo(shop, '/charges', key, { body: { label, amount: 100 } });
    expect(corrected.status).toBe(201);
    expect(corrected.headers['idempotent-replayed']).toBeUndefined();
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
  });

  it('malformed JSON answers as the app alone does and claims nothing', async () => {
    const { key, without, first, retry } = await exchange('/charges', { rawBody: '{"label": "x", "amount": ' });
    expect(without.status).toBe(400);
    expectSameAnswer(first, without);
    expectSameAnswer(retry, without);
    expect(await keyRow(key)).toBeUndefined();
  });

  it.each([
    ['a number out of range', (label: string, marker: string) => `{"label":"${label}","amount":1e400,"description":"${marker}"}`],
    ['a lone surrogate', (label: string, marker: string) => `{"label":"${label}","amount":1,"description":"${marker}\\ud800"}`],
    [
      '5,000 levels of nesting',
      (label: string, marker: string) =>
        `{"label":"${label}","amount":1,"description":"${marker}","n":${'['.repeat(4_999)}${']'.repeat(4_999)}}`,
    ],
  ])("%s in the body is the module's 400 problem, claims nothing, and logs no stack trace or body", async (_what, body) => {
    const label = fresh();
    const key = newKey();
    const logged = shop.nestLog.lines.length;
    const res = await postTo(shop, '/charges', key, { rawBody: body(label, newMarker()) });
    expectProblem(res, 400, 'urn:nest-idempotency:problem:unrepresentable-body');
    expect(await keyRow(key)).toBeUndefined();
    expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(0);
    const lines = shop.nestLog.lines.slice(logged);
    expect(lines.filter((line) => /\n\s+at \S/.test(line) || line.includes(label))).toEqual([]);
  });

  describe('inherited routes: Guarded extends Base is idempotent, Skipped extends Base is not, whichever is hit first', () => {
    async function guarded(route: string) {
      const label = fresh();
      const { key, without, first, retry } = await exchange(`/guarded/${route}`, { body: { label } });
      expect(without.status).toBe(201);
      expect(without.json()).toEqual({ data: { label, controller: 'GuardedController' } });
      expectSameAnswer(first, without);
      expectReplayOf(retry, first);
      expect(await keyRow(key)).toMatchObject({ status: 'completed' });
      expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(1);
    }

    async function skipped(route: string) {
      const label = fresh();
      const { key, without, first, retry } = await exchange(`/skipped/${route}`, { body: { label } });
      expect(without.json()).toEqual({ data: { label, controller: 'SkippedController' } });
      expectSameAnswer(first, without);
      expectSameAnswer(retry, without);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(await keyRow(key)).toBeUndefined();
      expect(await effects(shopDb, EFFECT_KINDS.ledger, label)).toBe(2);
    }

    it('class-level @Idempotent() on the subclass, Guarded hit first', async () => {
      await guarded('one');
      await skipped('one');
    });

    it('class-level @Idempotent() on the subclass, Skipped hit first', async () => {
      await skipped('two');
      await guarded('two');
    });

    it('method-level @Idempotent() on the shared base method, Guarded hit first', async () => {
      await guarded('marked-one');
      await skipped('marked-one');
    });

    it('method-level @Idempotent() on the shared base method, Skipped hit first', async () => {
      await skipped('marked-two');
      await guarded('marked-two');
    });
  });

  it('TypeORM query logging (all, with parameters) and the Nest logs never carry a key or a body marker', async () => {
    // Its own traffic through every path that writes or reads a key, so this test stands alone too.
    const charge = { label: fresh(), amount: 700, description: newMarker() };
    const { key } = await exchange('/charges', { body: charge });
    // A mismatch (its answer is pinned by the refunds test): the claim finds the key with another body.
    expect((await postTo(shop, '/charges', key, { body: { ...charge, description: newMarker() } })).status).toBe(422);
    await exchange('/charges/declined', { body: { label: fresh(), description: newMarker() } });
    await exchange('/charges/provider-reset', { body: { label: fresh(), description: newMarker() } });

    const typeorm = shop.typeormLog.lines;
    // Logging is on and captured: the app's own statement is there with its parameters.
    expect(typeorm.some((line) => line.includes('INSERT INTO effects') && line.includes(charge.label))).toBe(true);
    const leaks = (lines: string[]) => lines.filter((line) => [...secrets].some((secret) => line.includes(secret)));
    expect(leaks(typeorm)).toEqual([]);
    expect(leaks(shop.nestLog.lines)).toEqual([]);
  });
});
