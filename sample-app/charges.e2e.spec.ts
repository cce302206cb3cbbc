import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { databaseUrl, freshSchema, sqlClient } from '../test/support/database.js';
import { send, sleep, type RawResponse } from '../test/support/http.js';
import { TcpProxy, throughProxy } from '../test/support/tcp-proxy.js';
import { loadConfig, type HttpAdapterName } from './config.js';
import { createSampleApp } from './create-app.js';

const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const KEY_A = 'demo-key-tenant-a';
const KEY_B = 'demo-key-tenant-b';
/** What Nest's exception layer answers for an error that is not an `HttpException`. */
const NEST_INTERNAL_ERROR = { statusCode: 500, message: 'Internal server error' };

interface RunningApp {
  app: INestApplication;
  url: string;
}

/** Boots the sample app as `main.ts` would, from environment-style config, on a free loopback port. */
async function startSampleApp(
  adapter: HttpAdapterName,
  schema: string,
  url = databaseUrl(),
  env: Record<string, string> = {},
): Promise<RunningApp> {
  const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: url, ...env });
  const app = await createSampleApp({ ...config, databaseUrl: url, databaseSchema: schema, logger: false });
  await app.listen(0, '127.0.0.1');
  return { app, url: await app.getUrl() };
}

describe.each(ADAPTERS)('sample payments API over %s', (adapter) => {
  let api: RunningApp;
  let db: pg.Client;
  let n = 0;
  /** A value unique to one test, used as customer and key so rows can be counted per test. */
  const unique = (label: string) => `${label}-${adapter}-${Date.now()}-${++n}`;

  beforeAll(async () => {
    const schema = await freshSchema(`sample_app_${adapter}`);
    api = await startSampleApp(adapter, schema);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await api?.app.close();
    await db?.end();
  });

  const charge = (overrides: Record<string, unknown> = {}) => ({
    amount: 2500,
    currency: 'usd',
    customer: unique('cus'),
    ...overrides,
  });
  /** `apiKey: null` sends no Authorization header. */
  const postCharge = (body: unknown, key: string | undefined, apiKey: string | null = KEY_A, rawBody?: string) => {
    const headers: Array<[string, string]> = [];
    if (apiKey !== null) headers.push(['Authorization', `Bearer ${apiKey}`]);
    if (key !== undefined) headers.push(['Idempotency-Key', key]);
    return send(api.url, 'POST', '/charges', { headers, body, rawBody });
  };
  const get = (path: string, apiKey = KEY_A) => send(api.url, 'GET', path, { headers: [['Authorization', `Bearer ${apiKey}`]] });

  const chargeRows = async (customer: string) =>
    (await db.query('SELECT * FROM charges WHERE customer = $1 ORDER BY tenant_id', [customer])).rows;
  const keyRows = async (key: string) =>
    (await db.query('SELECT tenant_id, status, response_status FROM idempotency_keys WHERE key = $1 ORDER BY tenant_id', [key]))
      .rows;

  it('GET /health answers 200 without an API key while the database is up', async () => {
    const res = await send(api.url, 'GET', '/health');
    expect(res.status).toBe(200);
    expect(res.json()).toMatchObject({ status: 'ok', info: { database: { status: 'up' } } });
  });

  it('creates a charge: 201, Location, the documented shape, one row in the request transaction', async () => {
    const body = charge();
    const key = unique('key');
    const before = Date.now();
    const res = await postCharge(body, key);
    expect(res.status).toBe(201);
    const created = res.json();
    expect(created).toEqual({
      id: expect.stringMatching(/^ch_[0-9a-f]{24}$/),
      object: 'charge',
      amount: 2500,
      currency: 'usd',
      customer: body.customer,
      description: null,
      metadata: {},
      status: 'succeeded',
      created: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
    });
    expect(Math.abs(Date.parse(created.created) - before)).toBeLessThan(60_000);
    expect(res.headers.location).toBe(`/charges/${created.id}`);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(res.headers['idempotent-replayed']).toBeUndefined();

    const rows = await chargeRows(body.customer);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ id: created.id, tenant_id: 'tenant-a', amount: 2500, description: null, metadata: {} });
    expect(await keyRows(key)).toEqual([{ tenant_id: 'tenant-a', status: 'completed', response_status: 201 }]);

    const fetched = await get(`/charges/${created.id}`);
    expect(fetched.status).toBe(200);
    expect(fetched.json()).toEqual(created);
  });

  it('keeps description and metadata as given', async () => {
    const body = charge({ description: 'Coffee beans ☕', metadata: { order: 'o-1', lines: [1, 2], nested: { ok: true } } });
    const res = await postCharge(body, unique('key'));
    expect(res.status).toBe(201);
    expect(res.json()).toMatchObject({
      description: 'Coffee beans ☕',
      metadata: { order: 'o-1', lines: [1, 2], nested: { ok: true } },
    });
    const [row] = await chargeRows(body.customer);
    expect(row.description).toBe('Coffee beans ☕');
    expect(row.metadata).toEqual({ order: 'o-1', lines: [1, 2], nested: { ok: true } });
  });

  it('a retry with the same key replays the stored response byte for byte and charges once', async () => {
    const body = charge({ metadata: { b: 1, a: 2 } });
    const key = unique('key');
    const first = await postCharge(body, key);
    expect(first.status).toBe(201);
    // Same JSON with its keys in another order: the same request.
    const reordered = { metadata: { a: 2, b: 1 }, customer: body.customer, currency: body.currency, amount: body.amount };
    const second = await postCharge(reordered, key);
    expect(second.status).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(second.body, first.body)).toBe(0);
    expect(second.headers.location).toBe(first.headers.location);
    expect(second.headers['content-type']).toBe(first.headers['content-type']);
    expect(await chargeRows(body.customer)).toHaveLength(1);
  });

  it('the same key with a changed body answers 422 and charges nothing more', async () => {
    const body = charge();
    const key = unique('key');
    const first = await postCharge(body, key);
    expect(first.status).toBe(201);
    const changed = await postCharge({ ...body, amount: 9999 }, key);
    expect(changed.status).toBe(422);
    // Exactly what docs/sample-app.md shows: no charset parameter (JSON is UTF-8 by definition, RFC 8259).
    expect(changed.headers['content-type']).toBe('application/problem+json');
    expect(changed.json()).toMatchObject({ type: ProblemType.mismatch, status: 422 });
    // The stored charge must not leak into the problem.
    expect(changed.text()).not.toContain(first.json().id);
    expect(await chargeRows(body.customer)).toHaveLength(1);
  });

  it('a retry while the first attempt is still running answers 409 with Retry-After, then replays', async () => {
    const body = charge({ simulate: { delayMs: 1_500 } });
    const key = unique('key');
    const slow = postCharge(body, key);
    // The duplicate goes once the first attempt holds the key (its claim commits before the handler runs),
    // however long that takes on a loaded machine, not after a guess at it.
    const deadline = Date.now() + 20_000;
    while ((await keyRows(key)).length === 0) {
      if (Date.now() > deadline) throw new Error(`The first attempt never claimed ${key}.`);
      await sleep(20);
    }
    const conflict = await postCharge(body, key);
    expect(conflict.status).toBe(409);
    expect(conflict.headers['content-type']).toBe('application/problem+json');
    expect(conflict.json()).toMatchObject({ type: ProblemType.conflict, status: 409 });
    const retryAfter = Number(conflict.headers['retry-after']);
    expect(Number.isInteger(retryAfter)).toBe(true);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(30);
    // While in flight, a different body under the key is still a mismatch.
    expect((await postCharge({ ...body, amount: 1 }, key)).status).toBe(422);

    const first = await slow;
    expect(first.status).toBe(201);
    const replay = await postCharge(body, key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(replay.body, first.body)).toBe(0);
    expect(await chargeRows(body.customer)).toHaveLength(1);
  });

  it('keeps the internal riskScore in the charges table, out of every response and out of the stored response', async () => {
    const body = charge({ amount: 2500 });
    const key = unique('key');
    const created = await postCharge(body, key);
    expect(created.status).toBe(201);
    expect(created.json()).not.toHaveProperty('riskScore');
    expect(created.text()).not.toMatch(/risk/i);
    // The fraud screen's score for 2500 (see risk-score.ts): in the row, as the entity has it.
    const [row] = await chargeRows(body.customer);
    expect(row.risk_score).toBe(42);

    const replay = await postCharge(body, key);
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(replay.body, created.body)).toBe(0);
    const [stored] = (await db.query('SELECT response_body FROM idempotency_keys WHERE key = $1', [key])).rows;
    const storedBody = (stored.response_body as Buffer).toString('utf8');
    expect(storedBody).not.toMatch(/risk/i);
    expect(JSON.parse(storedBody)).toEqual(created.json());

    const fetched = await get(`/charges/${created.json().id}`);
    expect(fetched.status).toBe(200);
    expect(fetched.json()).toEqual(created.json());
    const list = await get('/charges');
    expect(list.status).toBe(200);
    expect(list.text()).not.toMatch(/risk/i);
    expect((list.json().data as Array<{ id: string }>).map((c) => c.id)).toContain(created.json().id);
  });

  it.each([
    ['a NUL', '/charges/ch_%00'],
    ['a NUL after a well-formed id', `/charges/ch_${'a'.repeat(24)}%00`],
    ['a NUL alone', '/charges/%00'],
    ['another control character', `/charges/ch_${'a'.repeat(23)}%01`],
    ['no ch_ prefix', '/charges/not-a-charge-id'],
    ['the prefix and too few digits', '/charges/ch_abc'],
    ['upper-case hex', `/charges/ch_${'A'.repeat(24)}`],
    ['a non-ASCII character', `/charges/ch_${'a'.repeat(23)}%C3%A9`],
    // Longer ones never reach the route on Fastify: a 414 for a parameter over its maxParamLength (100).
    ['too many digits', `/charges/ch_${'a'.repeat(60)}`],
  ])('GET /charges/:id with %s (an id that cannot exist) answers 404, never 500', async (_case, path) => {
    const res = await get(path);
    expect(res.status).toBe(404);
    expect(res.json()).toEqual({ statusCode: 404, message: 'No such charge.', error: 'Not Found' });
  });

  it.each([
    ['a stray %', '/charges/ch_%zz'],
    ['a truncated UTF-8 sequence', '/charges/ch_%E0%A4%A'],
    ['a byte that is no UTF-8', '/charges/ch_%FF'],
  ])(
    'GET /charges/:id with %s in the path is a 400 of the router (a URL that cannot be decoded), never 500',
    async (_case, path) => {
      const res = await get(path);
      expect(res.status).toBe(400);
    },
  );

  it('a declined card answers 402, is stored and replayed, and leaves no charge row', async () => {
    const body = charge({ simulate: { outcome: 'decline' } });
    const key = unique('key');
    const first = await postCharge(body, key);
    expect(first.status).toBe(402);
    expect(first.json()).toMatchObject({ title: 'Card declined', status: 402 });
    expect(first.headers.location).toBeUndefined();
    const second = await postCharge(body, key);
    expect(second.status).toBe(402);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(second.body, first.body)).toBe(0);
    expect(await chargeRows(body.customer)).toHaveLength(0);
    expect(await keyRows(key)).toEqual([{ tenant_id: 'tenant-a', status: 'completed', response_status: 402 }]);
  });

  it('a processor error answers 500, rolls the charge back and keeps the key in flight until its lease ends', async () => {
    const body = charge({ simulate: { outcome: 'error' } });
    const key = unique('key');
    const first = await postCharge(body, key);
    expect(first.status).toBe(500);
    expect(first.json()).toEqual(NEST_INTERNAL_ERROR);
    expect(await chargeRows(body.customer)).toHaveLength(0);
    expect(await keyRows(key)).toEqual([{ tenant_id: 'tenant-a', status: 'in_flight', response_status: null }]);
    expect((await postCharge(body, key)).status).toBe(409);
  });

  it.each([
    ['no Authorization header', null],
    ['an unknown API key', 'not-a-key'],
    ['the other case of a known key', KEY_A.toUpperCase()],
  ])('answers 401 with %s, before any idempotency key is claimed', async (_case, apiKey) => {
    const body = charge();
    const key = unique('key');
    const res = await postCharge(body, key, apiKey);
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toBe('Bearer realm="payments"');
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json(;|$)/);
    expect(res.json()).toEqual({
      type: 'about:blank',
      title: 'Unauthorized',
      status: 401,
      detail: 'Send a valid API key as "Authorization: Bearer <key>".',
    });
    expect(await keyRows(key)).toHaveLength(0);
    expect(await chargeRows(body.customer)).toHaveLength(0);
  });

  it('answers 401 for a non-Bearer scheme, and before the missing-key check', async () => {
    const basic = await send(api.url, 'POST', '/charges', {
      headers: [
        ['Authorization', `Basic ${Buffer.from(`${KEY_A}:`).toString('base64')}`],
        ['Idempotency-Key', unique('key')],
      ],
      body: charge(),
    });
    expect(basic.status).toBe(401);
    // No key and no credentials: authentication comes first.
    expect((await postCharge(charge(), undefined, null)).status).toBe(401);
    expect((await get('/charges', 'wrong')).status).toBe(401);
  });

  it('requires an Idempotency-Key on POST /charges', async () => {
    const body = charge();
    const res = await postCharge(body, undefined);
    expect(res.status).toBe(400);
    expect(res.json()).toMatchObject({ type: ProblemType.missingKey });
    expect(await chargeRows(body.customer)).toHaveLength(0);
  });

  it('scopes keys and charges per tenant', async () => {
    const body = charge();
    const key = unique('shared-key');
    const ofA = await postCharge(body, key, KEY_A);
    // The same key and body from another tenant is a new request, not a replay of tenant-a's.
    const ofB = await postCharge(body, key, KEY_B);
    expect(ofA.status).toBe(201);
    expect(ofB.status).toBe(201);
    expect(ofB.headers['idempotent-replayed']).toBeUndefined();
    const idA: string = ofA.json().id;
    const idB: string = ofB.json().id;
    expect(idB).not.toBe(idA);
    expect((await chargeRows(body.customer)).map((r) => [r.tenant_id, r.id])).toEqual([
      ['tenant-a', idA],
      ['tenant-b', idB],
    ]);
    expect((await keyRows(key)).map((r) => r.tenant_id)).toEqual(['tenant-a', 'tenant-b']);

    expect((await get(`/charges/${idA}`, KEY_B)).status).toBe(404);
    expect((await get(`/charges/${idB}`, KEY_A)).status).toBe(404);
    expect((await get(`/charges/${idA}`, KEY_A)).json()).toEqual(ofA.json());
    expect((await get('/charges/ch_does_not_exist', KEY_A)).status).toBe(404);

    for (const [apiKey, tenant, own, other] of [
      [KEY_A, 'tenant-a', idA, idB],
      [KEY_B, 'tenant-b', idB, idA],
    ]) {
      const list = await get('/charges', apiKey);
      expect(list.status).toBe(200);
      const { object, data, count } = list.json();
      const inDb = Number((await db.query('SELECT count(*) FROM charges WHERE tenant_id = $1', [tenant])).rows[0].count);
      expect(object).toBe('list');
      expect(count).toBe(inDb);
      const ids = (data as Array<{ id: string }>).map((c) => c.id);
      expect(ids).toContain(own);
      expect(ids).not.toContain(other);
      const owners = await db.query('SELECT DISTINCT tenant_id FROM charges WHERE id = ANY($1)', [ids]);
      expect(owners.rows).toEqual([{ tenant_id: tenant }]);
    }
  });

  it('lists newest first and honours limit while count stays the total', async () => {
    for (let i = 0; i < 2; i++) expect((await postCharge(charge(), unique('key'), KEY_B)).status).toBe(201);
    const all = (await get('/charges', KEY_B)).json();
    const limited = await get('/charges?limit=1', KEY_B);
    expect(limited.status).toBe(200);
    expect(limited.json().data).toEqual([all.data[0]]);
    expect(limited.json().count).toBe(all.count);
    const created = (all.data as Array<{ created: string }>).map((c) => c.created);
    expect([...created].sort().reverse()).toEqual(created);
    expect((await get('/charges?limit=0', KEY_B)).status).toBe(400);
  });

  it('a rejected body answers 400 and releases the key, so a corrected body works with the same key', async () => {
    const body = charge();
    const key = unique('key');
    const bad = await postCharge({ ...body, currency: 'USD' }, key);
    expect(bad.status).toBe(400);
    expect(await keyRows(key)).toHaveLength(0);
    const malformed = await postCharge(undefined, key, KEY_A, '{"amount": 25');
    expect(malformed.status).toBe(400);
    expect(await keyRows(key)).toHaveLength(0);

    const good = await postCharge(body, key);
    expect(good.status).toBe(201);
    expect(good.headers['idempotent-replayed']).toBeUndefined();
    expect(await chargeRows(body.customer)).toHaveLength(1);
    expect(await keyRows(key)).toEqual([{ tenant_id: 'tenant-a', status: 'completed', response_status: 201 }]);
  });

  it.each<[string, Record<string, unknown>]>([
    ['amount 0', { amount: 0 }],
    ['amount above 100000000', { amount: 100_000_001 }],
    ['a fractional amount', { amount: 12.5 }],
    ['amount as a string', { amount: '2500' }],
    ['currency in upper case', { currency: 'USD' }],
    ['a four-letter currency', { currency: 'usdt' }],
    ['an empty customer', { customer: '' }],
    ['a customer of 101 characters', { customer: 'c'.repeat(101) }],
    ['no customer', { customer: undefined }],
    ['a numeric description', { description: 42 }],
    ['U+0000 in the description', { description: 'nul \u0000 here' }],
    ['metadata as an array', { metadata: [1, 2] }],
    ['metadata as a string', { metadata: 'x' }],
    ['U+0000 in metadata', { metadata: { note: 'a\u0000b' } }],
    ['simulate.delayMs above 60000', { simulate: { delayMs: 60_001 } }],
    ['a negative simulate.delayMs', { simulate: { delayMs: -1 } }],
    ['an unknown simulate.outcome', { simulate: { outcome: 'explode' } }],
    ['an unknown simulate field', { simulate: { fail: true } }],
    ['simulate as a string', { simulate: 'decline' }],
    ['an unknown field', { captured: true }],
  ])('answers 400 for %s and leaves no key behind', async (_case, overrides) => {
    const body = charge(overrides);
    const key = unique('key');
    const res = await postCharge(body, key);
    expect(res.status).toBe(400);
    expect(await keyRows(key)).toHaveLength(0);
    expect(await db.query('SELECT 1 FROM charges WHERE customer = $1', [String(body.customer)])).toMatchObject({ rowCount: 0 });
  });

  it('accepts the bounds: amount 1 and 100000000, a 100-character customer, delayMs 0, null optionals', async () => {
    for (const overrides of [
      { amount: 1 },
      { amount: 100_000_000, customer: 'c'.repeat(95) + `${n}`.padStart(5, '0') },
      { simulate: { delayMs: 0 }, description: null, metadata: null },
    ]) {
      const res = await postCharge(charge(overrides), unique('key'));
      expect(res.status).toBe(201);
      if ('metadata' in overrides) expect(res.json()).toMatchObject({ description: null, metadata: {} });
    }
  });

  it('accepts a request body of almost 1 MiB and refuses a larger one with 413', async () => {
    const body = charge({ description: 'd'.repeat(1_000_000) });
    const res = await postCharge(body, unique('key'));
    expect(res.status).toBe(201);
    const [row] = await chargeRows(body.customer);
    expect(row.description).toHaveLength(1_000_000);

    const tooLarge = charge({ description: 'd'.repeat(1_100_000) });
    const key = unique('key');
    const refused = await postCharge(tooLarge, key);
    expect(refused.status).toBe(413);
    expect(await keyRows(key)).toHaveLength(0);
    expect(await chargeRows(tooLarge.customer)).toHaveLength(0);
  });
});

/**
 * The handler's failures that leave the outcome unknown: the key stays in
 * flight until its lease ends, then a retry takes it over and runs again.
 * A lease short enough to wait out.
 */
describe.each(ADAPTERS)('sample payments API over %s: failures that keep the key in flight', (adapter) => {
  const LEASE_MS = 1_500;
  let api: RunningApp;
  let db: pg.Client;
  let n = 0;
  const unique = (label: string) => `${label}-${adapter}-${Date.now()}-${++n}`;

  beforeAll(async () => {
    const schema = await freshSchema(`sample_app_in_flight_${adapter}`);
    api = await startSampleApp(adapter, schema, databaseUrl(), { IDEMPOTENCY_LEASE_MS: String(LEASE_MS) });
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await api?.app.close();
    await db?.end();
  });

  const postCharge = (body: unknown, key: string) =>
    send(api.url, 'POST', '/charges', {
      headers: [
        ['Authorization', `Bearer ${KEY_A}`],
        ['Idempotency-Key', key],
      ],
      body,
    });
  const keyRow = async (key: string) =>
    (
      await db.query(
        `SELECT status, attempt, owner_token, response_status, response_body IS NULL AS nothing_stored
           FROM idempotency_keys WHERE tenant_id = 'tenant-a' AND key = $1`,
        [key],
      )
    ).rows;
  const chargeCount = async (customer: string) =>
    Number((await db.query('SELECT count(*) FROM charges WHERE customer = $1', [customer])).rows[0].count);
  /** Waits until the database clock (which the module uses) says the key's lease has ended. */
  async function leaseEnded(key: string): Promise<void> {
    for (let i = 0; i < 100; i++) {
      const [row] = (await db.query('SELECT lease_expires_at <= now() AS ended FROM idempotency_keys WHERE key = $1', [key]))
        .rows;
      if (row?.ended) return;
      await sleep(100);
    }
    throw new Error(`The lease of ${key} did not end.`);
  }

  it('simulate.outcome "network" (the provider\'s socket dropped, ECONNRESET) is the handler\'s 500, never a 503: rolled back, key in flight, 409 until the lease ends, then it runs again', async () => {
    const customer = unique('cus');
    const body = { amount: 2500, currency: 'usd', customer, simulate: { outcome: 'network' } };
    const key = unique('key');
    const first = await postCharge(body, key);
    expect(first.status).toBe(500);
    expect(first.headers['content-type']).toMatch(/^application\/json/);
    expect(first.json()).toEqual(NEST_INTERNAL_ERROR);
    expect(first.headers['retry-after']).toBeUndefined();
    expect(await chargeCount(customer)).toBe(0);
    const [inFlight] = await keyRow(key);
    expect(inFlight).toMatchObject({ status: 'in_flight', attempt: 1, response_status: null, nothing_stored: true });

    const early = await postCharge(body, key);
    expect(early.status).toBe(409);
    expect(early.json()).toMatchObject({ type: ProblemType.conflict, status: 409 });
    expect(await keyRow(key)).toEqual([inFlight]);

    await leaseEnded(key);
    const again = await postCharge(body, key);
    expect(again.status).toBe(500);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(again.json()).toEqual(NEST_INTERNAL_ERROR);
    const [takenOver] = await keyRow(key);
    expect(takenOver).toMatchObject({ status: 'in_flight', attempt: 2, nothing_stored: true });
    expect(takenOver.owner_token).not.toBe(inFlight.owner_token);
    expect(await chargeCount(customer)).toBe(0);
  });

  it('simulate.outcome "unavailable" is the handler\'s own 503: not stored, key in flight, 409 until the lease ends, then it runs again', async () => {
    const customer = unique('cus');
    const body = { amount: 2500, currency: 'usd', customer, simulate: { outcome: 'unavailable' } };
    const key = unique('key');
    const handlers503 = {
      statusCode: 503,
      message: 'The card processor is unavailable (simulated).',
      error: 'Service Unavailable',
    };
    const first = await postCharge(body, key);
    expect(first.status).toBe(503);
    // Nest's answer for the handler's exception, not the module's problem+json for a store it cannot reach.
    expect(first.headers['content-type']).toMatch(/^application\/json/);
    expect(first.json()).toEqual(handlers503);
    expect(await chargeCount(customer)).toBe(0);
    const [inFlight] = await keyRow(key);
    expect(inFlight).toMatchObject({ status: 'in_flight', attempt: 1, response_status: null, nothing_stored: true });

    const early = await postCharge(body, key);
    expect(early.status).toBe(409);
    expect(early.json()).toMatchObject({ type: ProblemType.conflict, status: 409 });
    expect(await keyRow(key)).toEqual([inFlight]);

    await leaseEnded(key);
    const again = await postCharge(body, key);
    expect(again.status).toBe(503);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(again.json()).toEqual(handlers503);
    const [takenOver] = await keyRow(key);
    expect(takenOver).toMatchObject({ status: 'in_flight', attempt: 2, nothing_stored: true });
    expect(takenOver.owner_token).not.toBe(inFlight.owner_token);
    expect(await chargeCount(customer)).toBe(0);
  });
});

describe('sample app startup and health', () => {
  it('several instances start against one empty schema at once and apply each migration once', async () => {
    const schema = await freshSchema('sample_app_startup');
    const apps = await Promise.allSettled(
      ['express', 'fastify', 'express', 'fastify', 'express', 'fastify'].map((adapter) =>
        createSampleApp({
          ...loadConfig({ HTTP_ADAPTER: adapter }),
          databaseUrl: databaseUrl(),
          databaseSchema: schema,
          logger: false,
        }),
      ),
    );
    await Promise.all(apps.map((app) => (app.status === 'fulfilled' ? app.value.close() : undefined)));
    expect(apps.filter((app) => app.status === 'rejected')).toEqual([]);

    const db = await sqlClient(schema);
    try {
      const migrations = await db.query('SELECT name FROM migrations ORDER BY id');
      expect(migrations.rows.map((r) => r.name)).toEqual([
        'CreateIdempotencyKeys1764460800000',
        'CreateCharges1764460900000',
        'CreateOutboxMessages1764547200000',
        'CreateOrders1764547300000',
        'AddChargeRiskScore1764720000000',
        'AddProviderAccounts1764720100000',
        'CreateEffectLedger1764806400000',
        'CreateRefunds1764806500000',
        'UpgradeIdempotencyKeys1767225600000',
      ]);
      const tables = await db.query('SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1', [
        schema,
      ]);
      expect(tables.rows.map((r) => r.table_name)).toEqual([
        'charges',
        'effect_ledger',
        'idempotency_keys',
        'migrations',
        'orders',
        'outbox_messages',
        'provider_charges',
        'receipt_deliveries',
        'refunds',
      ]);
    } finally {
      await db.end();
    }
  });

  it.each(ADAPTERS)('over %s, /health answers 503 while the database is unreachable and 200 once it is back', async (adapter) => {
    const target = new URL(databaseUrl());
    const proxy = new TcpProxy(Number(target.port || 5432), target.hostname);
    await proxy.start();
    const schema = await freshSchema(`sample_app_health_${adapter}`);
    const api = await startSampleApp(adapter, schema, throughProxy(databaseUrl(), proxy));
    try {
      expect((await send(api.url, 'GET', '/health')).status).toBe(200);
      await proxy.cut();
      const down = await send(api.url, 'GET', '/health');
      expect(down.status).toBe(503);
      expect(down.json()).toMatchObject({ status: 'error', error: { database: { status: 'down' } } });
      // The idempotency store is unreachable too: 503 without running the handler.
      const customer = `cus-unreachable-${adapter}`;
      const refused = await send(api.url, 'POST', '/charges', {
        headers: [
          ['Authorization', `Bearer ${KEY_A}`],
          ['Idempotency-Key', `k-${customer}`],
        ],
        body: { amount: 100, currency: 'usd', customer },
      });
      expect(refused.status).toBe(503);
      expect(refused.headers['retry-after']).toBeDefined();

      await proxy.restore();
      let up: RawResponse | undefined;
      for (let attempt = 0; attempt < 20 && up?.status !== 200; attempt++) {
        up = await send(api.url, 'GET', '/health');
        if (up.status !== 200) await sleep(250);
      }
      expect(up?.status).toBe(200);
      const db = await sqlClient(schema);
      try {
        expect((await db.query('SELECT count(*) FROM charges WHERE customer = $1', [customer])).rows[0].count).toBe('0');
      } finally {
        await db.end();
      }
    } finally {
      await api.app.close();
      await proxy.cut();
    }
  });
});
