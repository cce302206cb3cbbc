import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { HttpService } from '@nestjs/axios';
import { Body, Controller, Inject, Injectable, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { firstValueFrom } from 'rxjs';
import { IdempotentClient } from '../../src/client/index.js';
import { DownstreamKeys, Idempotent, IdempotencyConfigurationError, IdempotencyModule } from '../../src/index.js';
import { createDownstreamFetch, downstreamPurpose, IdempotentHttpModule } from '../../src/outbound/index.js';
import { createTables, dataSourceOptions, freshSchema } from '../support/database.js';
import { ADAPTERS, type AdapterName } from '../support/test-app.js';
import { RecordingProvider } from './support/recording-provider.js';

/** What a handler saw: the keys it would derive by hand, to compare with what the provider got. */
interface Seen {
  derived: Record<string, string>;
  provider: Array<{ id: string }>;
}

/** How the handlers reach the provider: fetch through createDownstreamFetch, or axios through IdempotentHttpModule's HttpService. */
interface Outbound {
  post(url: string, purpose?: string, headers?: Record<string, string>): Promise<{ id: string }>;
  get(url: string): Promise<{ id: string }>;
}

const OUTBOUND = Symbol('OUTBOUND');

/** Failures still to come per label: a handler that must fail its first attempt(s) after calling the provider. */
const failuresLeft = new Map<string, number>();

@Injectable()
class FetchOutbound implements Outbound {
  private readonly fetch = createDownstreamFetch({ maxLength: 64 });
  async post(url: string, purpose?: string, headers: Record<string, string> = {}) {
    const res = await this.fetch(url, { method: 'POST', body: '{}', headers, idempotencyPurpose: purpose });
    return (await res.json()) as { id: string };
  }
  async get(url: string) {
    return (await (await this.fetch(url)).json()) as { id: string };
  }
}

@Injectable()
class AxiosOutbound implements Outbound {
  constructor(private readonly http: HttpService) {}
  async post(url: string, purpose?: string, headers: Record<string, string> = {}) {
    const config = purpose === undefined ? { headers } : downstreamPurpose(purpose, { headers });
    return (await firstValueFrom(this.http.post<{ id: string }>(url, {}, config))).data;
  }
  async get(url: string) {
    return (await firstValueFrom(this.http.get<{ id: string }>(url))).data;
  }
}

function controllerFor(providerUrl: () => string) {
  @Controller()
  class PaymentsController {
    constructor(
      private readonly keys: DownstreamKeys,
      @Inject(OUTBOUND) private readonly outbound: Outbound,
    ) {}

    @Post('pay')
    @Idempotent({ lease: 600, ttl: '1h' })
    async pay(@Body() body: { label: string }): Promise<Seen> {
      const provider = [await this.outbound.post(`${providerUrl()}/v1/charges`, 'charge')];
      const left = failuresLeft.get(body.label) ?? 0;
      if (left > 0) {
        failuresLeft.set(body.label, left - 1);
        // After the provider call: this attempt's outcome is lost, the key stays in flight.
        throw new Error('crashed after the provider call');
      }
      return { derived: { charge: this.keys.derive('charge', { maxLength: 64 }) }, provider };
    }

    @Post('pay-default')
    @Idempotent()
    async payDefault(): Promise<Seen> {
      const provider = [await this.outbound.post(`${providerUrl()}/v1/charges?attempt=${Date.now()}`)];
      return { derived: { default: this.keys.derive('POST /v1/charges', { maxLength: 64 }) }, provider };
    }

    @Post('pay-and-fee')
    @Idempotent()
    async payAndFee(): Promise<Seen> {
      const provider = [
        await this.outbound.post(`${providerUrl()}/v1/charges`, 'charge'),
        await this.outbound.post(`${providerUrl()}/v1/charges`, 'fee'),
      ];
      return { derived: {}, provider };
    }

    @Post('pay-twice')
    @Idempotent()
    async payTwice(): Promise<Seen> {
      await this.outbound.post(`${providerUrl()}/v1/twice`);
      await this.outbound.post(`${providerUrl()}/v1/twice`);
      return { derived: {}, provider: [] };
    }

    @Post('own-header')
    @Idempotent()
    async ownHeader(): Promise<Seen> {
      return { derived: {}, provider: [await this.outbound.post(`${providerUrl()}/v1/own`, 'x', { 'Idempotency-Key': 'mine' })] };
    }

    @Post('read')
    @Idempotent()
    async read(): Promise<Seen> {
      return { derived: {}, provider: [await this.outbound.get(`${providerUrl()}/v1/balance`)] };
    }

    @Post('plain')
    async plain(): Promise<Seen> {
      return { derived: {}, provider: [await this.outbound.post(`${providerUrl()}/v1/plain`, 'charge')] };
    }
  }
  return PaymentsController;
}

const VARIANTS = ['fetch', 'axios'] as const;
const CASES = ADAPTERS.flatMap((adapter) =>
  VARIANTS.map((variant) => [adapter, variant] as [AdapterName, (typeof VARIANTS)[number]]),
);

describe.each(CASES)('outbound calls with derived keys over %s, via %s', (adapter, variant) => {
  const provider = new RecordingProvider();
  let app: INestApplication;
  let appUrl: string;
  let client: IdempotentClient;
  let n = 0;
  const fresh = () => `${adapter}-${variant}-${Date.now()}-${++n}`;
  const send = (path: string, key = fresh(), body: Record<string, unknown> = { label: key }) => client.post(path, body, { key });

  beforeAll(async () => {
    await provider.start();
    const schema = await freshSchema(`client_outbound_${adapter}_${variant}`);
    await createTables(schema);
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        IdempotencyModule.forRoot({ tenant: () => 'tenant-a', sweep: false }),
        ...(variant === 'axios' ? [IdempotentHttpModule.register({ maxLength: 64, http: { timeout: 5_000 } })] : []),
      ],
      controllers: [controllerFor(() => provider.url)],
      providers: [
        variant === 'axios' ? { provide: OUTBOUND, useClass: AxiosOutbound } : { provide: OUTBOUND, useClass: FetchOutbound },
      ],
    })
    class OutboundModule {}
    app =
      adapter === 'express'
        ? await NestFactory.create(OutboundModule, new ExpressAdapter(), { logger: false, abortOnError: false })
        : await NestFactory.create(OutboundModule, new FastifyAdapter(), { logger: false, abortOnError: false });
    await app.listen(0, '127.0.0.1');
    appUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
    client = new IdempotentClient({ baseUrl: appUrl });
  });
  afterAll(async () => {
    await app?.close();
    await provider.stop();
  });

  it('gives a POST inside an idempotent request the key DownstreamKeys derives for its purpose', async () => {
    const answer = await send('/pay');
    expect(answer.status).toBe(201);
    const seen = answer.json<Seen>();
    const [call] = provider.calls.filter((c) => c.key === seen.derived.charge);
    expect(call).toMatchObject({ method: 'POST', path: '/v1/charges' });
    expect(seen.derived.charge).toMatch(/^charge_[A-Za-z0-9_-]{22,}$/);
    expect(seen.derived.charge.length).toBeLessThanOrEqual(64);
  });

  it('sends the same key on the retry that takes the request over, so the provider charges once', async () => {
    const key = fresh();
    failuresLeft.set(key, 1);
    const before = provider.callsTo('/v1/charges').length;
    // The first attempt fails after calling the provider (a 500, the key kept for its 600 ms lease); opting in to
    // retrying that 500, the client meets a 409 until the lease ends, then the takeover runs the handler again.
    const retrying = new IdempotentClient({ baseUrl: appUrl, retryStatuses: [409, 500] });
    const answer = await retrying.post('/pay', { label: key }, { key });
    expect(answer.status).toBe(201);
    expect(answer.attempts).toBeGreaterThanOrEqual(2);
    const calls = provider.callsTo('/v1/charges').slice(before);
    expect(calls).toHaveLength(2);
    expect(calls[1].key).toBe(calls[0].key);
    expect(answer.json<Seen>().provider[0].id).toBe(provider.charges.get(calls[0].key!));
  });

  it('without a purpose, derives the key from method and path: the query (here a timestamp) does not change it', async () => {
    const answer = await send('/pay-default');
    const seen = answer.json<Seen>();
    expect(provider.calls.some((c) => c.path === '/v1/charges' && c.key === seen.derived.default)).toBe(true);
  });

  it('gives two calls to one endpoint with different purposes different keys', async () => {
    const before = provider.callsTo('/v1/charges').length;
    const answer = await send('/pay-and-fee');
    const [charge, fee] = provider.callsTo('/v1/charges').slice(before);
    expect(charge.key).toBeDefined();
    expect(fee.key).toBeDefined();
    expect(charge.key).not.toBe(fee.key);
    const [first, second] = answer.json<Seen>().provider;
    expect(first.id).not.toBe(second.id);
  });

  it('refuses a second call to the same method and path without a purpose, before it is sent', async () => {
    const before = provider.callsTo('/v1/twice').length;
    const answer = await send('/pay-twice');
    expect(answer.status).toBe(500);
    expect(provider.callsTo('/v1/twice').length - before).toBe(1);
  });

  it('leaves a key the call sets itself, a GET, and calls outside an idempotent request alone', async () => {
    await send('/own-header');
    await send('/read');
    await client.post('/plain', {});
    expect(provider.callsTo('/v1/own').at(-1)?.key).toBe('mine');
    expect(provider.callsTo('/v1/balance').at(-1)).toMatchObject({ method: 'GET', key: undefined });
    expect(provider.callsTo('/v1/plain').at(-1)).toMatchObject({ method: 'POST', key: undefined });
  });
});

describe('downstream key options', () => {
  it.each([
    ['a header that is no header name', { header: 'Idempotency Key' }],
    ['an empty method list', { methods: [] }],
    ['a maxLength below 22', { maxLength: 10 }],
  ])('createDownstreamFetch refuses %s', (_, options) => {
    expect(() => createDownstreamFetch(options)).toThrow(IdempotencyConfigurationError);
  });

  it('IdempotentHttpModule refuses bad options at registration', async () => {
    await expect(IdempotentHttpModule.register({ maxLength: 5 })).rejects.toThrow(IdempotencyConfigurationError);
  });
});
