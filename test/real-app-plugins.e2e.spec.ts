import { randomUUID } from 'node:crypto';
import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { send, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import {
  contentDigest,
  PLUGGED_TENANT,
  SESSION_COOKIE,
  SIZED_LIMIT,
  startPluggedApp,
  type PluggedApp,
} from './real-app/plugged-app.js';

/** Headers that differ between any two answers by design: the date and the connection's own. */
const PER_RESPONSE = new Set(['date', 'connection', 'keep-alive']);
const PER_REPLAY = new Set([...PER_RESPONSE, 'idempotent-replayed']);
/**
 * Headers about one answer's body, which a problem answer has its own of;
 * the rest (security headers, cookies) the app sets on every answer.
 */
const BODY_SPECIFIC = new Set([
  ...PER_REPLAY,
  'content-type',
  'content-length',
  'content-encoding',
  'transfer-encoding',
  'vary',
  'etag',
  'location',
  'content-digest',
  'retry-after',
]);

/** A cookie as a header line says it, its value left out: sessions and csrf tokens are new on every answer. */
function cookieShape(line: string): string {
  return line.replace(/^([^=]+)=[^;]*/, '$1=…');
}

/**
 * Every header as received, in order, names as the server spelled them, duplicates kept (one Set-Cookie line is
 * one entry), cookie values masked.
 */
function wireHeaders(res: RawResponse, ignore: ReadonlySet<string>): Array<[string, string]> {
  const raw = res.rawHeaders ?? [];
  const pairs: Array<[string, string]> = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (!ignore.has(name)) pairs.push([raw[i], name === 'set-cookie' ? cookieShape(raw[i + 1]) : raw[i + 1]]);
  }
  return pairs;
}

/** The body as the client reads it once it undoes the content coding. */
function decoded(res: RawResponse): Buffer {
  const encoding = res.headers['content-encoding'];
  if (encoding === undefined || encoding === 'identity') return res.body;
  if (encoding === 'gzip') return gunzipSync(res.body);
  if (encoding === 'br') return brotliDecompressSync(res.body);
  if (encoding === 'deflate') return inflateSync(res.body);
  throw new Error(`unexpected content-encoding ${String(encoding)}`);
}

function expectSameAnswer(actual: RawResponse, expected: RawResponse, ignore: ReadonlySet<string> = PER_RESPONSE): void {
  expect({ status: actual.status, headers: wireHeaders(actual, ignore), body: decoded(actual).toString('utf8') }).toEqual({
    status: expected.status,
    headers: wireHeaders(expected, ignore),
    body: decoded(expected).toString('utf8'),
  });
  // The encoded bytes too: both went through the same compression for the same Accept-Encoding.
  expect(Buffer.compare(actual.body, expected.body)).toBe(0);
}

function expectReplayOf(replay: RawResponse, twin: RawResponse): void {
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expectSameAnswer(replay, twin, PER_REPLAY);
}

/** One Set-Cookie header line per cookie: the session's and the csrf token, never joined into one. */
function expectTheAppsCookies(res: RawResponse): void {
  const lines = (res.rawHeaders ?? []).filter((_, i, raw) => i % 2 === 1 && raw[i - 1].toLowerCase() === 'set-cookie');
  expect(lines.map((line) => line.split('=')[0]).sort()).toEqual(['csrf', SESSION_COOKIE]);
}

/** The headers the app sets on every answer (helmet's, its cookies), as on another answer of the app. */
function expectAppWideHeadersOf(res: RawResponse, other: RawResponse): void {
  expect(wireHeaders(res, BODY_SPECIFIC)).toEqual(wireHeaders(other, BODY_SPECIFIC));
  expectTheAppsCookies(res);
  expect(res.headers['content-security-policy']).toEqual(expect.any(String));
  expect(res.headers['x-content-type-options']).toBe('nosniff');
}

/** The digest the app computed as the answer left is over the body the client got, not over another one. */
function expectDigestOfBody(res: RawResponse): void {
  expect(res.headers['content-digest']).toBe(contentDigest(decoded(res)));
}

function expectProblem(res: RawResponse, status: number, type: string): Record<string, unknown> {
  expect(res.status).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  const body = JSON.parse(decoded(res).toString('utf8')) as Record<string, unknown>;
  expect(body).toMatchObject({ type, status, title: expect.any(String), detail: expect.any(String) });
  return body;
}

/** Accept-Encoding of a client: none at all, or what it sends. */
type Accepts = string | undefined;
const NONE: Accepts = undefined;

/** One POST of JSON, with a key and an Accept-Encoding when given. */
function post(app: PluggedApp, path: string, key: string | undefined, body: unknown, accepts: Accepts = NONE) {
  const headers: Array<[string, string]> = [];
  if (key !== undefined) headers.push(['Idempotency-Key', key]);
  if (accepts !== undefined) headers.push(['Accept-Encoding', accepts]);
  return send(app.url, 'POST', path, { headers, body });
}

describe.each(ADAPTERS)('an app with helmet, compression, a session and a digest over %s', (adapter) => {
  let plain: PluggedApp;
  let shop: PluggedApp;
  let shopDb: pg.Client;
  let n = 0;
  const fresh = () => `${adapter}-${Date.now()}-${++n}`;
  const secrets = new Set<string>();
  const newKey = () => {
    const key = `idem-${randomUUID()}`;
    secrets.add(key);
    return key;
  };

  beforeAll(async () => {
    const plainSchema = await freshSchema(`plugged_plain_${adapter}`);
    const shopSchema = await freshSchema(`plugged_module_${adapter}`);
    await Promise.all([createTables(plainSchema), createTables(shopSchema)]);
    [plain, shop] = await Promise.all([startPluggedApp(adapter, plainSchema, false), startPluggedApp(adapter, shopSchema, true)]);
    shopDb = await sqlClient(shopSchema);
  });

  afterAll(async () => {
    await Promise.all([plain?.close(), shop?.close(), shopDb?.end()]);
  });

  const effects = async (label: string) =>
    Number((await shopDb.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await shopDb.query('SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', [PLUGGED_TENANT, key])).rows[0];

  describe('each answer, first or replayed, is encoded for its own request and is what the app answers alone', () => {
    const routes: Array<[string, number]> = [
      ['/orders', 201],
      ['/orders/text', 201],
      ['/orders/small', 201],
      ['/orders/declined', 402],
    ];
    const encodings: Array<[string, Accepts, Accepts]> = [
      ['first without Accept-Encoding, the replay with gzip', NONE, 'gzip'],
      ['first with gzip, the replay without Accept-Encoding', 'gzip', NONE],
      ['first with a browser’s list, the replay with br', 'gzip, deflate, br', 'br'],
    ];
    const cases = routes.flatMap(([path, status]) =>
      encodings.map(([what, first, retry]) => [path, status, what, first, retry] as const),
    );

    it.each(cases)('%s (%i): %s', async (path, status, _what, firstAccepts, retryAccepts) => {
      const label = fresh();
      const key = newKey();
      const body = { label };
      const twinFirst = await post(plain, path, key, body, firstAccepts);
      const first = await post(shop, path, key, body, firstAccepts);
      const twinRetry = await post(plain, path, key, body, retryAccepts);
      const replay = await post(shop, path, key, body, retryAccepts);

      expect(twinFirst.status).toBe(status);
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      expectSameAnswer(first, twinFirst);
      expectReplayOf(replay, twinRetry);
      for (const res of [twinFirst, first, twinRetry, replay]) {
        expectTheAppsCookies(res);
        expectDigestOfBody(res);
      }
      // Each answer is identity for a client that asked for none, whatever the other one asked for.
      for (const [res, accepts] of [
        [first, firstAccepts],
        [replay, retryAccepts],
      ] as const) {
        if (accepts === NONE) expect(res.headers['content-encoding']).toBeUndefined();
      }
      if (path !== '/orders/small') {
        // Big enough to be compressed whenever the client accepts it: the test sees both codings.
        expect([first, replay].some((res) => res.headers['content-encoding'] !== undefined)).toBe(true);
      }

      // Stored: the body before any content coding, without a coding of the platform's.
      const row = await keyRow(key);
      expect(row).toMatchObject({ status: 'completed', response_status: status });
      expect(Buffer.compare(row.response_body, decoded(twinFirst))).toBe(0);
      expect(JSON.stringify(row.response_headers)).not.toMatch(/content-encoding|set-cookie/i);
      expect(await effects(label)).toBe(status < 400 ? 1 : 0);
    });
  });

  // Nest's Express adapter sends a returned Buffer as JSON, so only a Fastify handler can answer bytes it encoded itself.
  if (adapter === 'fastify') {
    it.each([
      ['without Accept-Encoding', NONE],
      ['with gzip', 'gzip'],
    ])('bytes the handler encoded itself keep their Content-Encoding on the replay (%s)', async (_what, accepts) => {
      const label = fresh();
      const key = newKey();
      const twin = await post(plain, '/orders/pre-encoded', key, { label }, accepts);
      const first = await post(shop, '/orders/pre-encoded', key, { label }, accepts);
      const replay = await post(shop, '/orders/pre-encoded', key, { label }, accepts);
      expect(twin.headers['content-encoding']).toBe('gzip');
      expect(decoded(twin).toString('utf8')).toMatch(new RegExp(`^Archived order ${label}\\n`));
      expectSameAnswer(first, twin);
      expectReplayOf(replay, twin);
      expect((await keyRow(key)).response_headers).toContainEqual(['content-encoding', 'gzip']);
    });
  }

  describe("the module's own answers carry the app's cookies and security headers, as any other answer", () => {
    it('400 for a missing key', async () => {
      const label = fresh();
      const twin = await post(plain, '/orders', undefined, { label });
      const res = await post(shop, '/orders', undefined, { label }, 'gzip');
      expectProblem(res, 400, ProblemType.missingKey);
      expectAppWideHeadersOf(res, twin);
      expectDigestOfBody(res);
      expect(await effects(label)).toBe(0);
    });

    it('409 while the first attempt is in flight, then the replay once it is done', async () => {
      const label = fresh();
      const key = newKey();
      const twin = await post(plain, '/orders', key, { label });
      const first = post(shop, '/orders/slow', key, { label }, 'gzip');
      for (let i = 0; i < 500 && (await keyRow(key))?.status !== 'in_flight'; i++) await sleep(10);
      expect((await keyRow(key))?.status).toBe('in_flight');

      const conflict = await post(shop, '/orders/slow', key, { label });
      expectProblem(conflict, 409, ProblemType.conflict);
      expect(Number(conflict.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expectAppWideHeadersOf(conflict, twin);
      expectDigestOfBody(conflict);

      shop.gate.open(label);
      const done = await first;
      expect(done.status).toBe(201);
      expect(done.headers['content-encoding']).toBe('gzip');
      const replay = await post(shop, '/orders/slow', key, { label });
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['content-encoding']).toBeUndefined();
      expect(decoded(replay).toString('utf8')).toBe(decoded(done).toString('utf8'));
      expectAppWideHeadersOf(replay, twin);
      expectDigestOfBody(replay);
      expect(await effects(label)).toBe(1);
    });

    it('422 for the key with another body', async () => {
      const label = fresh();
      const key = newKey();
      const twin = await post(plain, '/orders', key, { label });
      expect((await post(shop, '/orders', key, { label })).status).toBe(201);
      const res = await post(shop, '/orders', key, { label: `${label}-other` }, 'br');
      expectProblem(res, 422, ProblemType.mismatch);
      expectAppWideHeadersOf(res, twin);
      expectDigestOfBody(res);
    });
  });

  describe('a response larger than its limit is neither held nor stored', () => {
    it.each([
      ['the route’s maxResponseBytes', '/orders/sized', SIZED_LIMIT, 'OrdersController.sized'],
      ['the default of 1 MiB', '/orders/export', 1024 * 1024, 'OrdersController.export'],
    ])(
      'at %s it is stored and replayed; one byte more is refused, rolled back and released',
      async (_what, path, limit, route) => {
        const fits = { label: fresh(), size: limit };
        const fitsKey = newKey();
        const twinFits = await post(plain, path, fitsKey, fits, 'gzip');
        const first = await post(shop, path, fitsKey, fits, 'gzip');
        const replay = await post(shop, path, fitsKey, fits);
        expectSameAnswer(first, twinFits);
        expect(decoded(replay).length).toBe(limit);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect((await keyRow(fitsKey)).response_body.length).toBe(limit);

        const over = { label: fresh(), size: limit + 1 };
        const key = newKey();
        const twin = await post(plain, path, key, over, 'gzip');
        expect(twin.status).toBe(201);
        expect(decoded(twin).length).toBe(limit + 1);
        const logged = shop.nestLog.lines.length;
        const refused = await post(shop, path, key, over, 'gzip');
        const problem = expectProblem(refused, 500, ProblemType.responseTooLarge);
        expect(problem.detail).toContain('maxResponseBytes');
        expect(problem.detail).toContain(route);
        expectAppWideHeadersOf(refused, twin);
        expectDigestOfBody(refused);
        expect(await keyRow(key)).toBeUndefined(); // released
        expect(await effects(over.label)).toBe(0); // rolled back

        // A retry is safe: it runs again (and is refused again), nothing replayed, nothing committed.
        const retry = await post(shop, path, key, over);
        expectProblem(retry, 500, ProblemType.responseTooLarge);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(await keyRow(key)).toBeUndefined();
        expect(await effects(over.label)).toBe(0);

        const lines = shop.nestLog.lines.slice(logged);
        expect(lines.some((line) => line.includes(route) && line.includes('maxResponseBytes'))).toBe(true);
        expect(lines.filter((line) => line.includes(key) || line.includes(over.label))).toEqual([]);
      },
    );

    it("an error the app renders past the limit (the handler's 402) is refused the same way, not stored", async () => {
      const declined = { label: fresh(), size: SIZED_LIMIT };
      const key = newKey();
      const twin = await post(plain, '/orders/declined-sized', key, declined);
      expect(twin.status).toBe(402);
      expect(twin.body.length).toBeGreaterThan(SIZED_LIMIT);
      const refused = await post(shop, '/orders/declined-sized', key, declined);
      const problem = expectProblem(refused, 500, ProblemType.responseTooLarge);
      expect(problem.detail).toContain('OrdersController.declinedSized');
      expectAppWideHeadersOf(refused, twin);
      expect(await keyRow(key)).toBeUndefined();
      expect(await effects(declined.label)).toBe(0);
    });
  });
});

describe.each(ADAPTERS)('the same app built through Test.createTestingModule over %s', (adapter) => {
  // Its providers exist before the HTTP adapter does, so the module can only hook into the platform once the app initialises.
  let plain: PluggedApp;
  let shop: PluggedApp;
  let n = 0;
  const fresh = () => `${adapter}-testing-${Date.now()}-${++n}`;

  beforeAll(async () => {
    const plainSchema = await freshSchema(`plugged_testing_plain_${adapter}`);
    const shopSchema = await freshSchema(`plugged_testing_module_${adapter}`);
    await Promise.all([createTables(plainSchema), createTables(shopSchema)]);
    [plain, shop] = await Promise.all([
      startPluggedApp(adapter, plainSchema, false, { testingModule: true }),
      startPluggedApp(adapter, shopSchema, true, { testingModule: true }),
    ]);
  });

  afterAll(async () => {
    await Promise.all([plain?.close(), shop?.close()]);
  });

  it('the first answer (gzip) and its replay (none asked) are each encoded for their own request, as the app answers alone', async () => {
    const label = fresh();
    const key = `idem-${randomUUID()}`;
    const twinFirst = await post(plain, '/orders', key, { label }, 'gzip');
    const first = await post(shop, '/orders', key, { label }, 'gzip');
    const twinRetry = await post(plain, '/orders', key, { label });
    const replay = await post(shop, '/orders', key, { label });
    expect(first.headers['content-encoding']).toBe('gzip');
    expect(replay.headers['content-encoding']).toBeUndefined();
    expectSameAnswer(first, twinFirst);
    expectReplayOf(replay, twinRetry);
    for (const res of [first, replay]) {
      expectTheAppsCookies(res);
      expectDigestOfBody(res);
    }
  });

  it("the module's 400 carries the app's cookies and security headers", async () => {
    const label = fresh();
    const twin = await post(plain, '/orders', undefined, { label });
    const res = await post(shop, '/orders', undefined, { label });
    expectProblem(res, 400, ProblemType.missingKey);
    expectAppWideHeadersOf(res, twin);
    expectDigestOfBody(res);
  });
});
