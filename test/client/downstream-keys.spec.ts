import { describe, expect, it } from '@jest/globals';
import type { EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../../src/index.js';
import { deriveKey } from '../../src/client/index.js';
import { attachDownstreamKeys, createDownstreamFetch, downstreamPurpose } from '../../src/outbound/index.js';
import { loadOptionalPackage } from '../../src/outbound/optional-package.js';
import { idempotencyContext } from '../../src/transaction/idempotency-context.js';

const SCOPE = { tenant: 'tenant-a', key: 'request-key-1', generation: '6f1c1b0e-7d1a-4a51-9c1e-2f0b7d7c9a10' };

/** Runs `work` as inside an idempotent execution of SCOPE (a fresh scope object: a new attempt). */
function insideExecution<T>(work: () => Promise<T>, scope = { ...SCOPE }): Promise<T> {
  return idempotencyContext.run({ manager: {} as EntityManager, transactional: true, handlerStarted: true, scope }, work);
}

/** A fetch that records what it was asked to send and answers 200. */
function recordingFetch() {
  const sent: Array<{ method: string; url: string; headers: Headers }> = [];
  const fetch = async (input: string | URL | Request, init?: RequestInit) => {
    const request = new Request(input, init);
    sent.push({ method: request.method, url: request.url, headers: request.headers });
    return new Response('{}');
  };
  return { fetch, sent };
}

describe('createDownstreamFetch', () => {
  it('keys POST and PATCH by default, not GET, PUT or DELETE', async () => {
    const { fetch, sent } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch });
    await insideExecution(async () => {
      for (const method of ['POST', 'PATCH', 'GET', 'PUT', 'DELETE']) await keyed(`https://p.example/v1/${method}`, { method });
    });
    expect(sent.map((s) => [s.method, s.headers.has('idempotency-key')])).toEqual([
      ['POST', true],
      ['PATCH', true],
      ['GET', false],
      ['PUT', false],
      ['DELETE', false],
    ]);
  });

  it('derives exactly deriveKey(scope, purpose, options), with the header and methods configured', async () => {
    const { fetch, sent } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch, header: 'X-Request-Key', methods: ['put'], maxLength: 40, secret: 's3cret' });
    await insideExecution(() => keyed('https://p.example/v1/items/1', { method: 'PUT', idempotencyPurpose: 'upsert' }));
    expect(sent[0].headers.get('x-request-key')).toBe(deriveKey(SCOPE, 'upsert', { maxLength: 40, secret: 's3cret' }));
    expect(sent[0].headers.has('idempotency-key')).toBe(false);
  });

  it('takes method, URL and headers from a Request, the init headers replacing them as fetch does', async () => {
    const { fetch, sent } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch });
    await insideExecution(async () => {
      await keyed(new Request('https://p.example/v1/a', { method: 'POST', headers: { 'x-a': '1' } }));
      await keyed(new Request('https://p.example/v1/b', { method: 'POST', headers: { 'x-a': '1' } }), {
        headers: { 'x-b': '2' },
      });
    });
    expect(sent[0].headers.get('idempotency-key')).toBe(deriveKey(SCOPE, 'POST /v1/a'));
    expect(sent[0].headers.get('x-a')).toBe('1');
    expect(sent[1].headers.get('idempotency-key')).toBe(deriveKey(SCOPE, 'POST /v1/b'));
    expect([sent[1].headers.get('x-a'), sent[1].headers.get('x-b')]).toEqual([null, '2']);
  });

  it('the default purpose is the method and the normalised path: host, query and fragment left out', async () => {
    const { fetch, sent } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch });
    await insideExecution(() => keyed('https://eu.p.example/v1/./charges?at=1#x', { method: 'post' }));
    await insideExecution(() => keyed('http://10.0.0.7:8080/v1/charges?at=2', { method: 'POST' }));
    expect(sent[0].headers.get('idempotency-key')).toBe(deriveKey(SCOPE, 'POST /v1/charges'));
    expect(sent[1].headers.get('idempotency-key')).toBe(sent[0].headers.get('idempotency-key'));
  });

  it('a new attempt of the request (a takeover) may repeat the calls of the attempt before it', async () => {
    const { fetch, sent } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch });
    await insideExecution(() => keyed('https://p.example/v1/charges', { method: 'POST' }));
    await insideExecution(() => keyed('https://p.example/v1/charges', { method: 'POST' }));
    expect(sent).toHaveLength(2);
    expect(sent[1].headers.get('idempotency-key')).toBe(sent[0].headers.get('idempotency-key'));
  });

  it('refuses an empty purpose', async () => {
    const { fetch } = recordingFetch();
    const keyed = createDownstreamFetch({ fetch });
    await expect(
      insideExecution(() => keyed('https://p.example/v1', { method: 'POST', idempotencyPurpose: '' })),
    ).rejects.toThrow(TypeError);
  });
});

describe('attachDownstreamKeys', () => {
  /** The request-interceptor surface of an axios instance, run as axios runs it. */
  function fakeAxios() {
    const interceptors: Array<((config: any) => any) | undefined> = [];
    return {
      interceptors: {
        request: {
          use: (fn: (config: any) => any) => interceptors.push(fn) - 1,
          eject: (id: number) => (interceptors[id] = undefined),
        },
      },
      send: (config: Record<string, unknown>) => interceptors.reduce((c, fn) => (fn ? fn(c) : c), config) as Record<string, any>,
    };
  }

  it('joins baseURL and url as axios does for the default purpose, and sets the header on plain-object headers', async () => {
    const axios = fakeAxios();
    attachDownstreamKeys(axios);
    const config = await insideExecution(async () =>
      axios.send({ method: 'post', baseURL: 'https://p.example/v1/', url: '/charges', headers: {} }),
    );
    expect(config.headers['Idempotency-Key']).toBe(deriveKey(SCOPE, 'POST /v1/charges'));
  });

  it('takes the purpose from downstreamPurpose(), keeps a key the call set, and can be detached', async () => {
    const axios = fakeAxios();
    const detach = attachDownstreamKeys(axios);
    const [named, own] = await insideExecution(async () => [
      axios.send({ method: 'post', url: 'https://p.example/x', ...downstreamPurpose('refund', { headers: {} }) }),
      axios.send({ method: 'post', url: 'https://p.example/y', headers: { 'idempotency-key': 'mine' } }),
    ]);
    expect(named.headers['Idempotency-Key']).toBe(deriveKey(SCOPE, 'refund'));
    expect(own.headers).toEqual({ 'idempotency-key': 'mine' });
    detach();
    const after = await insideExecution(async () => axios.send({ method: 'post', url: 'https://p.example/z', headers: {} }));
    expect(after.headers).toEqual({});
  });
});

describe('loadOptionalPackage', () => {
  it('turns a missing optional peer into a configuration error that says what to install', async () => {
    await expect(loadOptionalPackage('nest-idempotency-pg-no-such-peer', 'npm i the-peer')).rejects.toThrow(
      new IdempotencyConfigurationError('npm i the-peer'),
    );
  });

  it('returns the package when it is installed', async () => {
    const axios = await loadOptionalPackage<{ HttpModule: unknown }>('@nestjs/axios', 'unused');
    expect(typeof axios.HttpModule).toBe('function');
  });
});
