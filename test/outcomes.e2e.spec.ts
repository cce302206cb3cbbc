import { describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { post, send, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

describe.each(ADAPTERS)('handler outcomes and replay fidelity over %s', (adapter) => {
  const t = useApiSuite(adapter, 'outcomes');

  /** Sends the same request twice and checks the second is the first, byte for byte, plus the replay header. */
  async function expectIdenticalReplay(path: string, body: unknown, key: string) {
    const first = await post(t.api.url, path, body, key);
    const second = await post(t.api.url, path, body, key);
    expect(second.status).toBe(first.status);
    expect(Buffer.compare(second.body, first.body)).toBe(0);
    for (const header of ['content-type', 'location', 'etag', 'content-length']) {
      expect(second.headers[header]).toEqual(first.headers[header]);
    }
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(second.headers['idempotent-replayed']).toBe('true');
    return { first, second };
  }

  it('a validation pipe rejection releases the key: a corrected body runs at once', async () => {
    const label = t.fresh();
    const bad = await post(t.api.url, '/validated', { amount: 0, label }, `k-${label}`);
    expect(bad.status).toBe(400);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
    const good = await post(t.api.url, '/validated', { amount: 10, label }, `k-${label}`);
    expect(good.status).toBe(201);
    expect(t.api.probe.count(label)).toBe(1);
    expect(await t.effects(label)).toBe(1);
  });

  it('malformed JSON is answered 400 before any claim', async () => {
    const label = t.fresh();
    const res = await send(t.api.url, 'POST', '/items', {
      headers: [
        ['X-Tenant', 'tenant-a'],
        ['Idempotency-Key', `k-${label}`],
      ],
      rawBody: '{"label": ',
    });
    expect(res.status).toBe(400);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
  });

  it('an HttpException from the handler (402) is stored and replayed; its writes roll back', async () => {
    const label = t.fresh();
    const { first } = await expectIdenticalReplay('/decline', { label }, `k-${label}`);
    expect(first.status).toBe(402);
    expect(first.json()).toEqual({ type: 'card_declined', message: 'Your card was declined.' });
    expect(t.api.probe.count(label)).toBe(1);
    expect(await t.effects(label)).toBe(0);
    expect((await t.keyRow(`k-${label}`)).status).toBe('completed');
  });

  it('any other error rolls back and keeps the lease: 409 until it ends, then a retry takes over', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/boom', { label }, `k-${label}`);
    expect(first.status).toBe(500);
    expect(await t.effects(label)).toBe(0);
    const during = await post(t.api.url, '/boom', { label }, `k-${label}`);
    expect(during.status).toBe(409);
    expect(Number(during.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(t.api.probe.count(label)).toBe(1);
    await sleep(900); // the route's lease is 800 ms
    const after = await post(t.api.url, '/boom', { label }, `k-${label}`);
    expect(after.status).toBe(500);
    expect(t.api.probe.count(label)).toBe(2);
  });

  it("onError: 'release' deletes the claim so a retry runs at once", async () => {
    const label = t.fresh();
    expect((await post(t.api.url, '/boom-release', { label }, `k-${label}`)).status).toBe(500);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
    expect((await post(t.api.url, '/boom-release', { label }, `k-${label}`)).status).toBe(500);
    expect(t.api.probe.count(label)).toBe(2);
    expect(await t.effects(label)).toBe(0);
  });

  it('replays JSON with unicode, NUL and lone surrogates byte for byte', async () => {
    const label = t.fresh();
    const { first } = await expectIdenticalReplay('/unicode', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    expect(first.json().text).toContain('\u0000');
    expect(first.json().text).toContain('🦄');
    expect(first.text()).toContain('"order":{"z":1,"a":2}');
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('replays a text body with its platform content type', async () => {
    const label = t.fresh();
    const { first } = await expectIdenticalReplay('/text', { label }, `k-${label}`);
    expect(first.text()).toBe(`plain text for ${label} ✓`);
    expect(first.headers['content-type']).toMatch(adapter === 'express' ? /^text\/html/ : /^text\/plain/);
  });

  it('replays an empty 204', async () => {
    const label = t.fresh();
    const { first } = await expectIdenticalReplay('/empty', { label }, `k-${label}`);
    expect(first.status).toBe(204);
    expect(first.body.length).toBe(0);
    expect(await t.effects(label)).toBe(1);
  });

  it('replays a Buffer as the platform sent it: raw bytes on Fastify, its JSON form on Express', async () => {
    const label = t.fresh();
    const { first } = await expectIdenticalReplay('/buffer', { label }, `k-${label}`);
    const bytes = [0x00, 0xff, 0xfe, 0x80, 0x0a, 0x0d, ...Buffer.from(label)];
    if (adapter === 'fastify') {
      expect([...first.body]).toEqual(bytes);
      expect(first.headers['content-type']).toBe('application/octet-stream');
    } else {
      // What Express answers for a Buffer without the module: the module changes nothing.
      expect(first.json()).toEqual({ type: 'Buffer', data: bytes });
      expect(first.headers['content-type']).toMatch(/^application\/json/);
    }
  });

  it('replays @HttpCode, Location, ETag and configured headers; never Set-Cookie or unlisted headers', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/located', { label }, `k-${label}`);
    expect(first.status).toBe(202);
    expect(first.headers.location).toBe('/items/42');
    expect(first.headers['set-cookie']).toEqual(['session=secret']);
    expect(first.headers['x-not-stored']).toBe('per-response');
    const second = await post(t.api.url, '/located', { label }, `k-${label}`);
    expect(second.status).toBe(202);
    expect(second.headers.location).toBe('/items/42');
    expect(second.headers.etag).toBe(first.headers.etag);
    expect(second.headers['set-cookie']).toBeUndefined();
    const stored = await t.keyRow(`k-${label}`);
    expect(JSON.stringify(stored.response_headers)).not.toContain('session=secret');
    expect(JSON.stringify(stored.response_headers)).not.toContain('per-response');
    expect(second.headers['x-custom-replayed']).toBe('yes');
    expect(second.headers['x-not-stored']).toBe('per-response'); // set again by @Header(), not replayed from storage
    expect(Buffer.compare(second.body, first.body)).toBe(0);
    // Names as first sent (Express keeps the app's `Location`, Fastify sends every name in lower case), in order.
    const names = (res: RawResponse) =>
      (res.rawHeaders ?? [])
        .filter((_, i) => i % 2 === 0)
        .filter(
          (name) => !['date', 'connection', 'keep-alive', 'set-cookie', 'idempotent-replayed'].includes(name.toLowerCase()),
        );
    expect(names(second)).toEqual(names(first));
    expect(names(first)).toContain(adapter === 'express' ? 'X-Custom-Replayed' : 'x-custom-replayed');
  });

  it('replays a redirect with its status and Location', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/redirect', { label }, `k-${label}`);
    expect(first.status).toBe(303);
    expect(first.headers.location).toBe(`/charges/${label}`);
    const second = await post(t.api.url, '/redirect', { label }, `k-${label}`);
    expect(second.status).toBe(303);
    expect(second.headers.location).toBe(`/charges/${label}`);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('a route returning a stream answers a clear 500 problem and leaves no claim in flight', async () => {
    const label = t.fresh();
    const res = await post(t.api.url, '/stream', { label }, `k-${label}`);
    expect(res.status).toBe(500);
    expect(res.json()).toMatchObject({ type: ProblemType.unreplayable });
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
  });

  it('the same key in two tenants is two independent keys', async () => {
    const label = t.fresh();
    const key = `shared-${label}`;
    const a = await post(t.api.url, '/items', { label, who: 'a' }, key, 'tenant-a');
    const b = await post(t.api.url, '/items', { label, who: 'b' }, key, 'tenant-b');
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(b.text()).not.toContain('"who":"a"');
    const againB = await post(t.api.url, '/items', { label, who: 'b' }, key, 'tenant-b');
    expect(Buffer.compare(againB.body, b.body)).toBe(0);
    expect(t.api.probe.count(label)).toBe(2);
  });

  it('a tenant resolver that yields nothing fails closed with a 500 problem and runs nothing', async () => {
    const label = t.fresh();
    const res = await send(t.api.url, 'POST', '/items', { headers: [['Idempotency-Key', `k-${label}`]], body: { label } });
    expect(res.status).toBe(500);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.json()).toMatchObject({ type: ProblemType.tenantUnresolved });
    expect(t.api.probe.count(label)).toBe(0);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
  });

  it('a tenant resolver that throws fails closed too; an HttpException from it goes out as it is', async () => {
    const label = t.fresh();
    const bug = await post(t.api.url, '/items', { label }, `k-${label}`, 'resolver-bug');
    expect(bug.status).toBe(500);
    expect(bug.json()).toMatchObject({ type: ProblemType.tenantUnresolved });
    expect(bug.text()).not.toContain('principal');
    const refused = await post(t.api.url, '/items', { label }, `k-${label}`, 'resolver-refuses');
    expect(refused.status).toBe(401);
    expect(t.api.probe.count(label)).toBe(0);
    expect(await t.keyRow(`k-${label}`, 'resolver-bug')).toBeUndefined();
  });

  it("required: false runs a request without a key, once per request, in the request's manager", async () => {
    const label = t.fresh();
    expect((await post(t.api.url, '/optional', { label }, undefined)).status).toBe(201);
    expect((await post(t.api.url, '/optional', { label }, undefined)).status).toBe(201);
    expect(await t.effects(label)).toBe(2);
  });

  it('a missing key on a required route is a 400 problem', async () => {
    const label = t.fresh();
    const res = await post(t.api.url, '/items', { label }, undefined);
    expect(res.status).toBe(400);
    expect(res.json()).toMatchObject({ type: ProblemType.missingKey, status: 400, title: expect.any(String) });
    expect(t.api.probe.count(label)).toBe(0);
  });

  it('routes not marked @Idempotent() ignore the header', async () => {
    const label = t.fresh();
    await post(t.api.url, `/plain/${label}`, {}, `k-${label}`);
    await post(t.api.url, `/plain/${label}`, {}, `k-${label}`);
    expect(t.api.probe.count(label)).toBe(2);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
  });

  it('class-level @Idempotent() applies to every route, @SkipIdempotency() turns one off', async () => {
    const label = t.fresh();
    const on1 = await post(t.api.url, '/scoped/on', { label }, `k-${label}`);
    const on2 = await post(t.api.url, '/scoped/on', { label }, `k-${label}`);
    expect(on2.headers['idempotent-replayed']).toBe('true');
    expect(on2.json()).toEqual(on1.json());
    const off = await post(t.api.url, '/scoped/off', { label }, `k2-${label}`);
    const off2 = await post(t.api.url, '/scoped/off', { label }, `k2-${label}`);
    expect(off2.json().at).toBe(off.json().at + 1);
    expect((await post(t.api.url, '/scoped/on', { label }, undefined)).status).toBe(400);
    expect((await send(t.api.url, 'GET', '/scoped/health', { headers: [['X-Tenant', 'a']] })).status).toBe(200);
  });

  it('@SkipIdempotency(false) on a method switches idempotency back on under a skipping controller', async () => {
    const label = t.fresh();
    await post(t.api.url, '/mostly-off/off', { label }, `k-${label}`);
    await post(t.api.url, '/mostly-off/off', { label }, `k-${label}`);
    expect(t.api.probe.count(label)).toBe(2);
    expect(await t.keyRow(`k-${label}`)).toBeUndefined();
    const on = await post(t.api.url, '/mostly-off/back-on', { label: `${label}-on` }, `k-${label}-on`);
    const again = await post(t.api.url, '/mostly-off/back-on', { label: `${label}-on` }, `k-${label}-on`);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(again.body, on.body)).toBe(0);
    expect(t.api.probe.count(`${label}-on`)).toBe(1);
  });

  it('a per-route fingerprint decides what counts as the same request', async () => {
    const label = t.fresh();
    const first = await post(t.api.url, '/custom-fingerprint', { label, amount: 5 }, `k-${label}`);
    const sameAmount = await post(t.api.url, '/custom-fingerprint', { label: 'other', amount: 5 }, `k-${label}`);
    expect(sameAmount.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(sameAmount.body, first.body)).toBe(0);
    const otherAmount = await post(t.api.url, '/custom-fingerprint', { label, amount: 6 }, `k-${label}`);
    expect(otherAmount.status).toBe(422);
  });

  it('a phased route resumes after the last recorded phase when a retry takes it over', async () => {
    const label = t.fresh();
    t.api.probe.crashAfter.set(label, 'first');
    const crashed = await post(t.api.url, '/phased', { label }, `k-${label}`);
    expect(crashed.status).toBe(500);
    expect((await t.keyRow(`k-${label}`)).recovery_point).toBe('first');
    expect(await t.effects(`${label}:first`)).toBe(1);
    await t.db.query(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' WHERE key = $1`, [`k-${label}`]);
    const resumed = await post(t.api.url, '/phased', { label }, `k-${label}`);
    expect(resumed.status).toBe(201);
    expect(resumed.json()).toMatchObject({ resumed: true, second: { downstreamKey: expect.stringMatching(/^provider_/) } });
    expect(t.api.probe.count(`${label}:first`)).toBe(1);
    expect(t.api.probe.count(`${label}:second`)).toBe(1);
    expect(await t.effects(`${label}:first`)).toBe(1);
    expect(await t.effects(`${label}:second`)).toBe(1);
    const replay = await post(t.api.url, '/phased', { label }, `k-${label}`);
    expect(Buffer.compare(replay.body, resumed.body)).toBe(0);
    expect(replay.headers['idempotent-replayed']).toBe('true');
  });

  it('the same key on another route is a mismatch', async () => {
    const label = t.fresh();
    await post(t.api.url, '/items', { label }, `k-${label}`);
    expect((await post(t.api.url, '/text', { label }, `k-${label}`)).status).toBe(422);
  });
});
