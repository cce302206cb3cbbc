import { describe, expect, it } from '@jest/globals';
import { inspect } from 'node:util';
import {
  businessKey,
  IdempotencyConfigurationError,
  IdempotentClient,
  OutcomeUnknownError,
  RetryBudget,
  type IdempotentClientOptions,
} from '../../src/client/index.js';
import { ProblemType } from '../../src/core/protocol.js';
import { ManualClock } from './support/manual-clock.js';
import { scriptedFetch, type Step } from './support/scripted-fetch.js';

/** The module's own 409: another attempt holds the key (the only 409 besides lease-lost that the client retries). */
const busyKey = (retryAfter: string): Step => ({
  status: 409,
  headers: { 'content-type': 'application/problem+json', 'retry-after': retryAfter },
  body: JSON.stringify({ type: ProblemType.conflict, title: 'Request in progress', status: 409, detail: '...' }),
});

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** A client on a manual clock and a scripted network; `random` 0 means no backoff unless a test asks for it. */
function setup(steps: Step[] | (() => Step), options: Partial<IdempotentClientOptions> = {}) {
  const clock = options.clock instanceof ManualClock ? options.clock : new ManualClock();
  const network = scriptedFetch(clock, steps);
  const client = new IdempotentClient({
    baseUrl: 'http://payments.test',
    fetch: network.fetch,
    clock,
    random: () => 0,
    ...options,
  });
  const start = clock.now();
  /** When each attempt was sent, in ms from the start. */
  const sentAt = () => network.calls.map((call) => call.at - start);
  const elapsed = () => clock.now() - start;
  return { clock, client, calls: network.calls, sentAt, elapsed };
}

const ok = (body: unknown = { id: 'ch_1' }, headers: Record<string, string> = {}): Step => ({
  status: 201,
  headers: { 'content-type': 'application/json', ...headers },
  body: JSON.stringify(body),
});

describe('IdempotentClient: one key per intent', () => {
  it('mints one key before the first attempt and sends it, unchanged, on every retry', async () => {
    const { clock, client, calls } = setup(['reset', { status: 503, headers: { 'retry-after': '0' } }, ok({ id: 'ch_1' })]);
    const result = await clock.run(client.post('/charges', { amount: 4200 }));
    expect(calls).toHaveLength(3);
    const keys = calls.map((call) => call.headers.get('idempotency-key'));
    expect(keys[0]).toMatch(UUID);
    expect(new Set(keys)).toEqual(new Set([keys[0]]));
    expect(result.key).toBe(keys[0]);
    expect(result).toMatchObject({ status: 201, ok: true, attempts: 3, gaveUp: undefined });
    expect(result.json()).toEqual({ id: 'ch_1' });
  });

  it('mints a different key for each intent', async () => {
    const { clock, client, calls } = setup([ok(), ok()]);
    await clock.run(client.post('/charges', {}));
    await clock.run(client.post('/charges', {}));
    expect(calls[0].headers.get('idempotency-key')).not.toBe(calls[1].headers.get('idempotency-key'));
  });

  it('sends a business key verbatim, and a key with a comma as an RFC 8941 string the server unquotes to the same key', async () => {
    const { clock, client, calls } = setup([ok(), ok(), ok()]);
    await clock.run(client.post('/charges', {}, { key: businessKey('order', 1042, 'capture') }));
    await clock.run(client.post('/charges', {}, { key: 'job:7:a,b' }));
    await clock.run(client.post('/charges', {}, { key: '"quoted\\' }));
    expect(calls.map((call) => call.headers.get('idempotency-key'))).toEqual([
      'order:1042:capture',
      '"job:7:a,b"',
      '"\\"quoted\\\\"',
    ]);
  });

  it('sends the same method, URL, headers and body bytes on every attempt, and says whether the final answer was a replay', async () => {
    const { clock, client, calls } = setup(['reset', 'reset', ok({ id: 'ch_9' }, { 'idempotent-replayed': 'true' })], {
      headers: { authorization: 'Bearer k' },
    });
    const result = await clock.run(client.post('/charges?x=1', { amount: 1, note: 'café' }, { headers: { 'x-trace': 't' } }));
    expect(result.replayed).toBe(true);
    const seen = calls.map((call) => ({
      method: call.method,
      url: call.url,
      body: call.body,
      type: call.headers.get('content-type'),
      auth: call.headers.get('authorization'),
      trace: call.headers.get('x-trace'),
    }));
    expect(seen).toEqual(
      Array(3).fill({
        method: 'POST',
        url: 'http://payments.test/charges?x=1',
        body: '{"amount":1,"note":"café"}',
        type: 'application/json',
        auth: 'Bearer k',
        trace: 't',
      }),
    );
  });

  it('a first answer that is not a replay says so', async () => {
    const { clock, client } = setup([ok()]);
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ replayed: false, attempts: 1 });
  });
});

describe('IdempotentClient: what it retries', () => {
  it.each([
    ['a reset connection', 'reset' as Step],
    ["the module's 409 (another attempt holds the key)", busyKey('1')],
    ['a 503', { status: 503, headers: { 'retry-after': '1' } } as Step],
    ['a 503 without Retry-After', { status: 503 } as Step],
    ['a 502', { status: 502 } as Step],
    ['a 504', { status: 504 } as Step],
  ])('retries %s with the same key', async (_, first) => {
    const { clock, client, calls } = setup([first, ok()]);
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status: 201, attempts: 2 });
    expect(calls[1].headers.get('idempotency-key')).toBe(calls[0].headers.get('idempotency-key'));
  });

  it('aborts an attempt that gets no answer within attemptTimeout and retries it', async () => {
    const { clock, client, sentAt } = setup(['hang', ok()], { attemptTimeout: 2_000 });
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status: 201, attempts: 2 });
    expect(sentAt()).toEqual([0, 2_000]);
  });

  // A 409 that is not the module's conflict or lease-lost problem is the application's answer.
  it.each([400, 401, 402, 403, 404, 409, 422, 429, 500, 501])('never retries a %i', async (status) => {
    const { clock, client, calls } = setup([{ status, body: 'no' }, ok()]);
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status, attempts: 1, ok: false, gaveUp: undefined });
    expect(calls).toHaveLength(1);
  });

  it.each([409, 503])('never retries a replayed %i: it is the stored outcome', async (status) => {
    const { clock, client, calls } = setup([{ status, headers: { 'idempotent-replayed': 'true' } }, ok()]);
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status, attempts: 1, replayed: true, gaveUp: undefined });
    expect(calls).toHaveLength(1);
  });

  it('retries what retryStatuses adds (a 429, a 500) when the caller opts in', async () => {
    const { clock, client } = setup([{ status: 429, headers: { 'retry-after': '2' } }, { status: 500 }, ok()], {
      retryStatuses: [409, 429, 500, 503],
    });
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status: 201, attempts: 3 });
  });

  it.each([400, 404, 422, 201, 302, 600, 1.5, '503'])('refuses %p in retryStatuses at construction', (status) => {
    expect(() => new IdempotentClient({ retryStatuses: [503, status as number] })).toThrow(IdempotencyConfigurationError);
  });
});

describe('IdempotentClient: waits', () => {
  it('waits what Retry-After says (delta-seconds or an HTTP-date) before retrying a 409 or a 503', async () => {
    const clock = new ManualClock();
    const inFive = new Date(clock.now() + 5_000).toUTCString();
    const { client, sentAt } = setup([busyKey('3'), { status: 503, headers: { 'retry-after': inFive } }, ok()], { clock });
    await clock.run(client.post('/charges', {}));
    // The date is 5 s from the start, and the second attempt went at 3 s: 2 s more.
    expect(sentAt()).toEqual([0, 3_000, 5_000]);
  });

  it('backs off exponentially with full jitter, up to maxDelay', async () => {
    const draws = [0.5, 0.5, 0.5, 0.5, 0.5, 0.999];
    const { clock, client, sentAt } = setup(['reset', 'reset', 'reset', 'reset', 'reset', 'reset', ok()], {
      initialDelay: 100,
      maxDelay: 1_000,
      maxAttempts: 10,
      random: () => draws.shift()!,
    });
    await clock.run(client.post('/charges', {}));
    const gaps = sentAt()
      .slice(1)
      .map((at, i) => at - sentAt()[i]);
    // Ceilings 100, 200, 400, 800, 1000 (capped), 1000; each wait is the draw times its ceiling.
    expect(gaps).toEqual([50, 100, 200, 400, 500, 999]);
  });

  it('takes the longer of Retry-After and its own backoff', async () => {
    const { clock, client, sentAt } = setup([{ status: 503, headers: { 'retry-after': '1' } }, 'reset', ok()], {
      initialDelay: 4_000,
      maxDelay: 4_000,
      random: () => 0.5,
    });
    await clock.run(client.post('/charges', {}));
    expect(sentAt()).toEqual([0, 2_000, 4_000]);
  });

  it('falls back to its backoff for an unreadable Retry-After', async () => {
    const { clock, client, sentAt } = setup([{ status: 503, headers: { 'retry-after': '1.5' } }, ok()], {
      initialDelay: 100,
      random: () => 0.5,
    });
    await clock.run(client.post('/charges', {}));
    expect(sentAt()).toEqual([0, 50]);
  });
});

describe('IdempotentClient: limits', () => {
  it('stops after maxAttempts and returns the last answer, saying it gave up', async () => {
    const { clock, client, calls } = setup(() => ({ status: 503, headers: { 'retry-after': '0' } }), { maxAttempts: 3 });
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status: 503, attempts: 3, gaveUp: 'attempts' });
    expect(calls).toHaveLength(3);
  });

  it('throws OutcomeUnknownError with the key when no attempt got an answer', async () => {
    const { clock, client, calls } = setup(() => 'reset', { maxAttempts: 3 });
    const error = await clock.run(client.post('/charges', {}, { key: 'intent-1' })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OutcomeUnknownError);
    expect(error).toMatchObject({ key: 'intent-1', attempts: 3, reason: 'attempts' });
    expect((error as Error).cause).toBeInstanceOf(TypeError);
    expect(calls).toHaveLength(3);
  });

  it('does not start a wait that would end past the deadline', async () => {
    const { clock, client, sentAt } = setup(() => ({ status: 503, headers: { 'retry-after': '10' } }), {
      deadline: 25_000,
      maxAttempts: 10,
    });
    const result = await clock.run(client.post('/charges', {}));
    expect(result).toMatchObject({ status: 503, attempts: 3, gaveUp: 'deadline' });
    expect(sentAt()).toEqual([0, 10_000, 20_000]);
  });

  it('cuts the last attempt short at the deadline', async () => {
    const { clock, client, sentAt, elapsed } = setup(() => 'hang', { deadline: 15_000, attemptTimeout: 10_000, maxAttempts: 10 });
    const error = await clock.run(client.post('/charges', {})).catch((e: unknown) => e);
    expect(error).toMatchObject({ reason: 'deadline', attempts: 2 });
    expect(sentAt()).toEqual([0, 10_000]);
    // The second attempt had 5 s left, not its full 10 s.
    expect(elapsed()).toBe(15_000);
  });

  it('a per-intent deadline overrides the client default', async () => {
    const { clock, client, calls } = setup(() => ({ status: 503, headers: { 'retry-after': '2' } }), {
      deadline: 60_000,
      maxAttempts: 100,
    });
    const result = await clock.run(client.post('/charges', {}, { deadline: 5_000 }));
    expect(result).toMatchObject({ attempts: 3, gaveUp: 'deadline' });
    expect(calls).toHaveLength(3);
  });

  it('draws retries from a budget every intent of the client shares, and gives up when it is spent', async () => {
    const { clock, client, calls } = setup(() => ({ status: 503, headers: { 'retry-after': '0' } }), {
      maxAttempts: 10,
      budget: { ratio: 0.5, minRetries: 2, window: 60_000 },
    });
    const first = await clock.run(client.post('/charges', {}));
    // 2 (floor) + 0.5 x 1 request: two retries, then the budget is spent.
    expect(first).toMatchObject({ status: 503, attempts: 3, gaveUp: 'budget' });
    const second = await clock.run(client.post('/charges', {}));
    // 2 + 0.5 x 2 = 3 retries in the window, 2 spent: one more.
    expect(second).toMatchObject({ attempts: 2, gaveUp: 'budget' });
    const third = await clock.run(client.post('/charges', {}));
    // 2 + 1.5 = 3.5, 3 spent: none left.
    expect(third).toMatchObject({ attempts: 1, gaveUp: 'budget' });
    expect(calls).toHaveLength(6);
  });

  it('a budget passed to several clients is shared by all of them', async () => {
    const clock = new ManualClock();
    const budget = new RetryBudget({ ratio: 0, minRetries: 1, window: 60_000, clock });
    const a = setup(() => ({ status: 503 }), { clock, budget, maxAttempts: 5 });
    const b = setup(() => ({ status: 503 }), { clock, budget, maxAttempts: 5 });
    expect(await clock.run(a.client.post('/x', {}))).toMatchObject({ attempts: 2, gaveUp: 'budget' });
    expect(await clock.run(b.client.post('/x', {}))).toMatchObject({ attempts: 1, gaveUp: 'budget' });
    expect(a.client.budget).toBe(budget);
  });
});

describe('IdempotentClient: aborting', () => {
  it('a caller abort during an attempt ends the intent with OutcomeUnknownError (aborted)', async () => {
    const { clock, client } = setup(() => 'hang');
    const controller = new AbortController();
    clock.schedule(500, () => controller.abort());
    const error = await clock.run(client.post('/charges', {}, { signal: controller.signal })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OutcomeUnknownError);
    expect(error).toMatchObject({ reason: 'aborted', attempts: 1 });
  });

  it('a caller abort during a wait ends it too, without another attempt', async () => {
    const { clock, client, calls } = setup(() => ({ status: 503, headers: { 'retry-after': '5' } }));
    const controller = new AbortController();
    clock.schedule(1_000, () => controller.abort());
    const error = await clock.run(client.post('/charges', {}, { signal: controller.signal })).catch((e: unknown) => e);
    expect(error).toMatchObject({ reason: 'aborted', attempts: 1 });
    expect(calls).toHaveLength(1);
  });

  it('an already aborted signal sends nothing', async () => {
    const { clock, client, calls } = setup([ok()]);
    const error = await clock.run(client.post('/charges', {}, { signal: AbortSignal.abort() })).catch((e: unknown) => e);
    expect(error).toMatchObject({ reason: 'aborted', attempts: 0 });
    expect(calls).toHaveLength(0);
  });
});

describe('IdempotentClient: refusals before any attempt', () => {
  it.each(['', 'has space', 'naïve', 'tab\t'])('refuses the key %p', async (key) => {
    const { clock, client, calls } = setup([ok()]);
    await expect(clock.run(client.post('/charges', {}, { key }))).rejects.toThrow(RangeError);
    expect(calls).toHaveLength(0);
  });

  it('refuses a key given as a header: the client sets it', async () => {
    const { clock, client } = setup([ok()]);
    await expect(clock.run(client.post('/charges', {}, { headers: { 'Idempotency-Key': 'k' } }))).rejects.toThrow(
      /Pass the idempotency key as `key`/,
    );
  });

  it('refuses a body that cannot be sent twice, and json with body', async () => {
    const { clock, client } = setup([ok()]);
    const stream = new ReadableStream() as unknown as string;
    await expect(clock.run(client.request({ url: '/charges', body: stream }))).rejects.toThrow(/same bytes/);
    await expect(clock.run(client.request({ url: '/charges', body: 'a', json: {} }))).rejects.toThrow(/not both/);
  });

  it('refuses a relative URL without a baseUrl', async () => {
    const { clock, client } = setup([ok()], { baseUrl: undefined });
    await expect(clock.run(client.post('/charges', {}))).rejects.toThrow(/baseUrl/);
  });

  it.each<[string, IdempotentClientOptions]>([
    ['maxAttempts 0', { maxAttempts: 0 }],
    ['a fractional deadline', { deadline: 1.5 }],
    ['maxDelay below initialDelay', { initialDelay: 500, maxDelay: 100 }],
    ['a keyHeader that is no header name', { keyHeader: 'Idempotency Key' }],
    ['a budget ratio above 1', { budget: { ratio: 2 } }],
    ['a negative budget floor', { budget: { minRetries: -1 } }],
    ['a baseUrl that is not absolute', { baseUrl: '/api' }],
  ])('refuses %s at construction, saying what is expected', (_, options) => {
    expect(() => new IdempotentClient(options)).toThrow(IdempotencyConfigurationError);
  });
});

describe('IdempotentClient: the key stays out of logs', () => {
  it('inspecting an answer or an OutcomeUnknownError does not print the key', async () => {
    const { clock, client } = setup([ok(), 'reset'], { maxAttempts: 1 });
    const answer = await clock.run(client.post('/charges', {}, { key: 'secret-key-1' }));
    const error = await clock.run(client.post('/charges', {}, { key: 'secret-key-2' })).catch((e: unknown) => e);
    expect(answer.key).toBe('secret-key-1');
    expect((error as OutcomeUnknownError).key).toBe('secret-key-2');
    expect(inspect(answer, { depth: 5 })).not.toContain('secret-key');
    expect(inspect(error, { depth: 5 })).not.toContain('secret-key');
    expect(JSON.stringify(answer)).not.toContain('secret-key');
    expect((error as Error).message).not.toContain('secret-key');
  });
});
