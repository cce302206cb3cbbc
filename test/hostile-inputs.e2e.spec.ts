import { connect } from 'node:net';
import { describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { post, send, type RawResponse } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

/** CONTRACT A2.4: a body canonical JSON cannot hold. Written out, not imported, so a renamed constant cannot hide a change. */
const UNREPRESENTABLE = 'urn:nest-idempotency:problem:unrepresentable-body';

/**
 * What each platform's router does with a request target that differs only in
 * spelling (checked against Express 5.x and Fastify 5.x as Nest 12 sets them
 * up, without options): Express routes ignore a trailing slash and letter
 * case; Fastify's router is strict about both.
 */
const ROUTER_MATCHES: Record<AdapterName, { trailingSlash: boolean; letterCase: boolean }> = {
  express: { trailingSlash: true, letterCase: true },
  fastify: { trailingSlash: false, letterCase: false },
};

/**
 * Sends one request exactly as written, request line included, on a plain
 * socket: Node's http client normalises the target (`/items?` loses its `?`
 * through URL) and never sends the absolute form to a server that is not a proxy.
 */
function sendRaw(baseUrl: string, target: string, headers: Array<[string, string]>, body: string): Promise<RawResponse> {
  const { hostname, port, host } = new URL(baseUrl);
  const payload = Buffer.from(body, 'utf8');
  const head = [
    `POST ${target} HTTP/1.1`,
    `Host: ${host}`,
    ...headers.map(([name, value]) => `${name}: ${value}`),
    'Content-Type: application/json',
    `Content-Length: ${payload.length}`,
    'Connection: close',
    '',
    '',
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    // No half-close after writing: a server may drop a request whose client has ended its side.
    const socket = connect(Number(port), hostname, () => socket.write(Buffer.concat([Buffer.from(head, 'latin1'), payload])));
    const chunks: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('end', () => {
      try {
        resolve(parseResponse(Buffer.concat(chunks)));
      } catch (error) {
        reject(error as Error);
      }
    });
  });
}

function parseResponse(raw: Buffer): RawResponse {
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) throw new Error(`No complete response head in ${JSON.stringify(raw.toString('latin1'))}`);
  const [statusLine, ...lines] = raw.subarray(0, end).toString('latin1').split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(':');
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  let body = raw.subarray(end + 4);
  if (/chunked/i.test(headers['transfer-encoding'] ?? '')) body = dechunk(body);
  return {
    status: Number(statusLine.split(' ')[1]),
    headers,
    body,
    json: () => JSON.parse(body.toString('utf8')),
    text: () => body.toString('utf8'),
  };
}

function dechunk(data: Buffer): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const lineEnd = data.indexOf('\r\n', at);
    const size = parseInt(data.subarray(at, lineEnd).toString('latin1'), 16);
    if (!size) return Buffer.concat(parts);
    parts.push(data.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
}

/**
 * JSON text whose nesting is `depth` levels of arrays and objects, counting the
 * body object itself as level 1: `{"label":…,"n":[]}` has depth 2.
 */
function nestedArrays(label: string, depth: number): string {
  const inner = depth - 1;
  return `{"label":${JSON.stringify(label)},"n":${'['.repeat(inner)}${']'.repeat(inner)}}`;
}

/** As `nestedArrays`, with objects: `{"label":…,"n":{}}` has depth 2. */
function nestedObjects(label: string, depth: number): string {
  const inner = depth - 1;
  return `{"label":${JSON.stringify(label)},"n":${'{"n":'.repeat(inner - 1)}{}${'}'.repeat(inner - 1)}}`;
}

describe.each(ADAPTERS)('hostile inputs over %s', (adapter) => {
  const t = useApiSuite(adapter, 'hostile');
  const headersFor = (key: string): Array<[string, string]> => [
    ['X-Tenant', 'tenant-a'],
    ['Idempotency-Key', key],
  ];
  const postRaw = (key: string, rawBody: string) => send(t.api.url, 'POST', '/items', { headers: headersFor(key), rawBody });

  /** A 400 unrepresentable-body problem that ran nothing and claimed nothing: the same key then runs a good body at once. */
  async function expectRefusedBody(rawBody: string, label: string) {
    const key = `k-${label}`;
    const res = await postRaw(key, rawBody);
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.json()).toEqual({
      type: UNREPRESENTABLE,
      title: expect.any(String),
      status: 400,
      detail: expect.any(String),
    });
    expect(t.api.probe.count(label)).toBe(0);
    expect(await t.keyRow(key)).toBeUndefined();
    expect(await t.effects(label)).toBe(0);

    const good = await post(t.api.url, '/items', { label }, key);
    expect(good.status).toBe(201);
    expect(good.headers['idempotent-replayed']).toBeUndefined();
    expect(t.api.probe.count(label)).toBe(1);
    return res;
  }

  describe('bodies canonical JSON cannot represent: 400 problem, nothing claimed', () => {
    it('a lone surrogate in a JSON string', async () => {
      const label = t.fresh();
      // The JSON escape \ud800 (six ASCII characters), which parses to a lone high surrogate.
      await expectRefusedBody(`{"label":${JSON.stringify(label)},"note":"\\ud800"}`, label);
    });

    it('a lone surrogate in an object key', async () => {
      const label = t.fresh();
      await expectRefusedBody(`{"label":${JSON.stringify(label)},"\\udfff":1}`, label);
    });

    it('a number out of range (1e400 parses to Infinity)', async () => {
      const label = t.fresh();
      await expectRefusedBody(`{"label":${JSON.stringify(label)},"amount":1e400}`, label);
    });

    it('5,000 levels of nesting', async () => {
      const label = t.fresh();
      await expectRefusedBody(nestedArrays(label, 5_000), label);
    });

    it('129 levels of nesting, arrays or objects (one past the documented limit of 128)', async () => {
      const arrays = t.fresh();
      await expectRefusedBody(nestedArrays(arrays, 129), arrays);
      const objects = t.fresh();
      await expectRefusedBody(nestedObjects(objects, 129), objects);
    });

    it('the refusal does not echo the body or a stack trace', async () => {
      const label = t.fresh();
      const res = await expectRefusedBody(`{"label":${JSON.stringify(label)},"secret":"s3cr3t","amount":1e400}`, label);
      expect(res.text()).not.toContain('s3cr3t');
      expect(res.text()).not.toMatch(/\bat .*\.(ts|js):\d+/);
    });
  });

  describe('a tenant the store cannot hold as it is fails closed like a resolver that finds none (CONTRACT A1.3, A5.12b)', () => {
    it.each([
      ['an empty string', 'resolver-empty'],
      ['a Buffer', 'resolver-buffer'],
      ['a string with a lone surrogate', 'resolver-lone-surrogate'],
      ['a string with a NUL', 'resolver-nul'],
    ])('the resolver returns %s: a 500 problem, nothing claimed or run', async (_case, resolverCase) => {
      const label = t.fresh();
      const res = await post(t.api.url, '/items', { label }, `k-${label}`, resolverCase);
      expect(res.status).toBe(500);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.json()).toMatchObject({ type: ProblemType.tenantUnresolved, status: 500 });
      expect(t.api.probe.count(label)).toBe(0);
      expect(await t.effects(label)).toBe(0);
      // Under no tenant at all: not the one it names, nor what the store would have made of it.
      expect((await t.db.query('SELECT count(*) FROM idempotency_keys WHERE key = $1', [`k-${label}`])).rows[0].count).toBe('0');
    });
  });

  it('128 levels of nesting are accepted, stored and replayed', async () => {
    for (const body of [nestedArrays, nestedObjects]) {
      const label = t.fresh();
      const first = await postRaw(`k-${label}`, body(label, 128));
      expect(first.status).toBe(201);
      const replay = await postRaw(`k-${label}`, body(label, 128));
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, first.body)).toBe(0);
      expect(t.api.probe.count(label)).toBe(1);
      expect(await t.effects(label)).toBe(1);
    }
  });

  describe('the fingerprint is the matched route and parsed query, not how the target was spelled', () => {
    /** Sends the same key and body to `firstTarget`, then to `secondTarget`. */
    async function twoTargets(firstTarget: string, secondTarget: string) {
      const label = t.fresh();
      const key = `k-${label}`;
      const body = JSON.stringify({ label });
      const first = await sendRaw(t.api.url, firstTarget, headersFor(key), body);
      expect(first.status).toBe(201);
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      const second = await sendRaw(t.api.url, secondTarget, headersFor(key), body);
      return { label, first, second };
    }

    async function expectReplay(firstTarget: string, secondTarget: string) {
      const { label, first, second } = await twoTargets(firstTarget, secondTarget);
      expect({ status: second.status, replayed: second.headers['idempotent-replayed'] }).toEqual({
        status: 201,
        replayed: 'true',
      });
      expect(Buffer.compare(second.body, first.body)).toBe(0);
      expect(t.api.probe.count(label)).toBe(1);
      expect(await t.effects(label)).toBe(1);
    }

    async function expectMismatch(firstTarget: string, secondTarget: string) {
      const { label, second } = await twoTargets(firstTarget, secondTarget);
      expect(second.status).toBe(422);
      expect(second.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(second.json()).toMatchObject({ type: ProblemType.mismatch, status: 422 });
      expect(t.api.probe.count(label)).toBe(1);
    }

    it('a trailing "?" is the same request', () => expectReplay('/items', '/items?'));

    it('query parameters in another order are the same request', () => expectReplay('/items?b=2&a=1', '/items?a=1&b=2'));

    it('a percent-encoded query value that decodes the same is the same request', () =>
      expectReplay('/items?a=1&b=x%20y', '/items?a=%31&b=x%20y'));

    it('a different query value is a different request (422)', () => expectMismatch('/items?a=1&b=2', '/items?a=1&b=3'));

    it('an added query parameter is a different request (422)', () => expectMismatch('/items', '/items?a=1'));

    if (ROUTER_MATCHES[adapter].trailingSlash) {
      it('a trailing slash the router ignores is the same route (replay)', () => expectReplay('/items', '/items/'));
    } else {
      it('a trailing slash the router does not match is a 404 that claims nothing', async () => {
        const label = t.fresh();
        const res = await sendRaw(t.api.url, '/items/', headersFor(`k-${label}`), JSON.stringify({ label }));
        expect(res.status).toBe(404);
        expect(await t.keyRow(`k-${label}`)).toBeUndefined();
      });
    }

    if (ROUTER_MATCHES[adapter].letterCase) {
      it('letter case the router ignores is the same route (replay)', () => expectReplay('/items', '/Items'));
    } else {
      it('letter case the router does not match is a 404 that claims nothing', async () => {
        const label = t.fresh();
        const res = await sendRaw(t.api.url, '/Items', headersFor(`k-${label}`), JSON.stringify({ label }));
        expect(res.status).toBe(404);
        expect(await t.keyRow(`k-${label}`)).toBeUndefined();
      });
    }

    it('the absolute form of the target (POST http://host/items) is the same route (replay)', () =>
      expectReplay('/items', `${t.api.url}/items`));

    it('the absolute form with a query in another order is the same request (replay)', () =>
      expectReplay(`${t.api.url}/items?b=2&a=1`, '/items?a=1&b=2'));
  });
});
