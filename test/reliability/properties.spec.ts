import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { send, type RawResponse } from '../support/http.js';
import { useApiSuite } from '../support/suite.js';
import { ADAPTERS } from '../support/test-app.js';

/** What the server should make of a header value, written independently of the module (CONTRACT A1). */
function expectedKey(value: string): string | undefined {
  // HTTP parsers strip optional whitespace around a field value before anyone sees it.
  const seen = value.replace(/^[ \t]+|[ \t]+$/g, '');
  let key = seen;
  if (seen.startsWith('"')) {
    const match = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(seen);
    if (!match) return undefined;
    key = match[1].replace(/\\(["\\])/g, '$1');
  } else if (seen.includes(',')) {
    return undefined;
  }
  if (key.length < 1 || key.length > 255 || !/^[\x21-\x7e]+$/.test(key)) return undefined;
  return key;
}

/** Characters node:http will put in a header value. */
const headerChar = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...'abcXYZ019-_.~!#$%&*+/:;<=>?@[]^`{|}'.split('')) },
  { weight: 2, arbitrary: fc.constantFrom('"', '\\', ',', ' ', '\t', '\u00e9', '\u00ff', "'") },
);
const headerValue = fc.oneof(
  fc.string({ unit: headerChar, minLength: 0, maxLength: 300 }),
  fc.string({ unit: headerChar, minLength: 0, maxLength: 40 }).map((s) => `"${s}"`),
);

/** Re-serialises JSON with its object keys in reverse order at every depth: the same request. */
function reorder(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reorder);
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value as Record<string, unknown>)
        .reverse()
        .map(([k, v]) => [k, reorder(v)]),
    );
  }
  return value;
}

describe.each(ADAPTERS)('properties over %s', (adapter) => {
  const t = useApiSuite(adapter, 'properties');
  let n = 0;
  const figures = { requests: 0, executions: 0, replays: 0, rejected: 0, serverErrors: 0 };

  const postRaw = async (key: string, body: unknown, tenant = 'prop'): Promise<RawResponse> => {
    figures.requests++;
    const res = await send(t.api.url, 'POST', '/items', {
      headers: [
        ['X-Tenant', tenant],
        ['Idempotency-Key', key],
      ],
      body,
    });
    if (res.status >= 500) figures.serverErrors++;
    return res;
  };

  it('any header value: a 400 problem exactly when the contract refuses it, never a 500, at most one execution', async () => {
    await fc.assert(
      fc.asyncProperty(headerValue, async (value) => {
        const label = `hk-${adapter}-${++n}`;
        // Keys are global to the tenant, so each run gets a tenant of its own.
        const tenant = `tenant-${label}`;
        const first = await postRaw(value, { label }, tenant);
        const key = expectedKey(value);
        if (key === undefined) {
          figures.rejected++;
          expect(first.status).toBe(400);
          expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
          expect(t.api.probe.count(label)).toBe(0);
          return;
        }
        expect(first.status).toBe(201);
        const stored = await t.db.query('SELECT key FROM idempotency_keys WHERE tenant_id = $1', [tenant]);
        expect(stored.rows.map((r) => r.key)).toEqual([key]);
        const again = await postRaw(value, { label }, tenant);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(Buffer.compare(again.body, first.body)).toBe(0);
        expect(t.api.probe.count(label)).toBe(1);
        figures.executions++;
        figures.replays++;
      }),
      { numRuns: 150 },
    );
  });

  it('any JSON body: executes once under concurrent duplicates, replays byte-identically (also reordered), 422 when changed', async () => {
    await fc.assert(
      fc.asyncProperty(fc.jsonValue({ maxDepth: 6 }), fc.integer({ min: 2, max: 6 }), async (data, copies) => {
        // Fastify's JSON parser refuses prototype-poisoning keys (400) before any handler runs.
        fc.pre(!/"(__proto__|constructor)"/.test(JSON.stringify(data)));
        const label = `body-${adapter}-${++n}`;
        const body = { label, data };
        const responses = await Promise.all(Array.from({ length: copies }, () => postRaw(`k-${label}`, body)));
        const originals = responses.filter((r) => r.status === 201 && !r.headers['idempotent-replayed']);
        expect(originals).toHaveLength(1);
        for (const r of responses) expect([201, 409]).toContain(r.status);
        const replay = await postRaw(`k-${label}`, reorder(body));
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(Buffer.compare(replay.body, originals[0].body)).toBe(0);
        const changed = await postRaw(`k-${label}`, { label, data: [data] });
        expect(changed.status).toBe(422);
        expect(t.api.probe.count(label)).toBe(1);
        expect(await t.effects(label)).toBe(1);
        figures.executions++;
        figures.replays++;
      }),
      { numRuns: 100 },
    );
  });

  it('malformed bodies never reach the handler, never leave a claim and never answer 500', async () => {
    await fc.assert(
      // An empty body is no body at all (Express parses it as {}), so it is not malformed.
      fc.asyncProperty(fc.string({ minLength: 1, maxLength: 200 }), async (text) => {
        fc.pre(!isJson(text));
        const label = `bad-${adapter}-${++n}`;
        figures.requests++;
        const res = await send(t.api.url, 'POST', '/items', {
          headers: [
            ['X-Tenant', 'prop'],
            ['Idempotency-Key', `k-${label}`],
          ],
          rawBody: text,
        });
        expect(res.status).toBeGreaterThanOrEqual(400);
        expect(res.status).toBeLessThan(500);
        expect(await t.keyRow(`k-${label}`, 'prop')).toBeUndefined();
        figures.rejected++;
      }),
      { numRuns: 100 },
    );
  });

  it('huge bodies: stored and replayed byte-identically, or refused by the body parser without a claim', async () => {
    for (const size of [64 * 1024, 512 * 1024, 2 * 1024 * 1024]) {
      const label = `huge-${adapter}-${size}`;
      const body = { label, blob: 'é🦄x'.repeat(Math.floor(size / 8)) };
      const first = await postRaw(`k-${label}`, body);
      if (first.status === 413) {
        expect(await t.keyRow(`k-${label}`, 'prop')).toBeUndefined();
        continue;
      }
      expect(first.status).toBe(201);
      const again = await postRaw(`k-${label}`, body);
      expect(Buffer.compare(again.body, first.body)).toBe(0);
      expect(t.api.probe.count(label)).toBe(1);
    }
    const duplicates = [...t.api.probe.invocations.values()].filter((count) => count > 1).length;
    console.log(
      `[properties/${adapter}] requests ${figures.requests}, executions ${figures.executions}, ` +
        `byte-identical replays ${figures.replays}, rejected ${figures.rejected}, ` +
        `duplicate executions ${duplicates}, 5xx answers ${figures.serverErrors}`,
    );
    expect(duplicates).toBe(0);
    expect(figures.serverErrors).toBe(0);
  });
});

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}
