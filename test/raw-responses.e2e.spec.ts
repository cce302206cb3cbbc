import type { ServerResponse } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Module,
  Post,
  Res,
  type CallHandler,
  type ExecutionContext,
  type INestApplication,
  type NestInterceptor,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import { concatMap, type Observable } from 'rxjs';
import type { EntityManager } from 'typeorm';
import { Idempotent, IdempotencyModule, TxManager } from '../src/index.js';
import { createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { post, sleep, type RawResponse } from './support/http.js';
import { CapturingNestLogger } from './real-app/log-capture.js';
import { keyTableOptions } from './support/key-table.js';
import { ADAPTERS, Probe, type AdapterName } from './support/test-app.js';

/*
 * Responses the application writes itself, through Node's ServerResponse (`@Res({ passthrough: true })` under Express,
 * `reply.raw` under Fastify): held by `WireCapture` (Express) and by the `WireCapture` guard of `FastifyReplyCapture`
 * (Fastify). `@Res()` without passthrough is refused at start-up on an idempotent route (docs/requests.md), so the
 * handlers take the response with passthrough, as the module's message tells.
 */

/** Written out, not imported, so a renamed constant cannot hide a change (docs/errors.md). */
const TOO_LARGE = 'urn:nest-idempotency:problem:response-too-large';
const CONFLICT = 'urn:nest-idempotency:problem:conflict';
const NOT_SENT = 'urn:nest-idempotency:problem:response-not-sent';

/** The too-large route's limit: its first chunk fits, the second passes it. */
const MAX_BYTES = 64;
/** The late route's lease, and how long its first attempt waits before it ends the response it began. */
const LATE_LEASE_MS = 400;
const LATE_END_MS = 1_200;
/** How much later than the app's own end Nest's passthrough reply comes on the late route (see `lateReply`). */
const REPLY_AFTER_END_MS = 100;

/** The chunks each route writes: a Buffer (a NUL and a byte that is no UTF-8), a string with non-ASCII characters. */
const bufferChunk = (label: string) => Buffer.concat([Buffer.from(`first:${label}:`), Buffer.from([0x00, 0xff, 0x0a])]);
const textChunk = 'zweiter Teil: grüße ✓ 漢字\n';
const lastChunk = (label: string) => `last:${label}\n`;
/** The body a client must get, as bytes: exactly what the handler wrote, in order. */
const fullBody = (label: string) =>
  Buffer.concat([bufferChunk(label), Buffer.from(textChunk, 'utf8'), Buffer.from(lastChunk(label))]);

/** Headers the handlers set: the first before `writeHead`, the second given to it. Both in the replay allowlist. */
const BEFORE = 'X-Set-Before';
const IN_HEAD = 'X-Given-To-WriteHead';

/** Node's response under either adapter: Express's `res` is one; Fastify's reply carries it as `raw`. */
function wireOf(res: unknown): ServerResponse {
  return (res as { raw?: ServerResponse }).raw ?? (res as ServerResponse);
}

/** Express: `res.status(201)`; Fastify: the same on `reply.raw` (Node's own statusCode). */
function setStatus(res: unknown, status: number): void {
  if ((res as { raw?: unknown }).raw) wireOf(res).statusCode = status;
  else (res as { status(code: number): unknown }).status(status);
}

/** Status and headers set, then the head written by hand; the caller writes the body. */
function writeHead(res: unknown, label: string): ServerResponse {
  const raw = wireOf(res);
  setStatus(res, 201);
  raw.setHeader('Content-Type', 'text/plain; charset=utf-8');
  raw.setHeader(BEFORE, 'before');
  raw.writeHead(201, { Location: `/raw/${label}`, [IN_HEAD]: 'in-head' });
  return raw;
}

/**
 * An app interceptor outside the module's. With `@Res({ passthrough: true })` Nest replies once the value comes out of
 * the interceptors (Express `res.send()`, Fastify `reply.send()`, both nothing once the response has ended): were it
 * to reply as soon as the handler returns, it would end the late route's response early. This holds its value back
 * until after the route's own end (the delay its handler is about to take from the probe).
 */
function lateReply(probe: Probe): NestInterceptor {
  return {
    intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
      const { url, body } = context.switchToHttp().getRequest<{ url: string; body?: { label?: string } }>();
      const planned = /\/raw\/late/.test(url) ? (probe.delays.get(body?.label ?? '')?.[0] ?? 0) : 0;
      const delay = planned && planned + REPLY_AFTER_END_MS;
      return next.handle().pipe(concatMap(async (value: unknown) => (delay ? (await sleep(delay), value) : value)));
    },
  };
}

function controller(probe: Probe) {
  @Controller('raw')
  class RawController {
    private async effect(manager: EntityManager, route: string, label: string) {
      probe.record(`${route}:${label}`);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [route, label]);
    }

    /** Writes its whole response itself, in several chunks. */
    @Post('written')
    @Idempotent()
    async written(
      @Body() body: { label: string },
      @TxManager() manager: EntityManager,
      @Res({ passthrough: true }) res: unknown,
    ) {
      await this.effect(manager, 'written', body.label);
      const raw = writeHead(res, body.label);
      raw.write(bufferChunk(body.label));
      raw.write(textChunk);
      raw.end(lastChunk(body.label));
    }

    /** The same without the module: what the app answers on its own. */
    @Post('written-plain')
    async writtenPlain(@Body() body: { label: string }, @Res({ passthrough: true }) res: unknown) {
      probe.record(`written-plain:${body.label}`);
      const raw = writeHead(res, body.label);
      raw.write(bufferChunk(body.label));
      raw.write(textChunk);
      raw.end(lastChunk(body.label));
    }

    /** The same response, but its second chunk passes the route's limit. */
    @Post('too-large')
    @Idempotent({ maxResponseBytes: MAX_BYTES })
    async tooLarge(
      @Body() body: { label: string },
      @TxManager() manager: EntityManager,
      @Res({ passthrough: true }) res: unknown,
    ) {
      await this.effect(manager, 'too-large', body.label);
      const raw = writeHead(res, body.label);
      raw.write(bufferChunk(body.label));
      raw.write(textChunk.repeat(4));
      raw.end(lastChunk(body.label));
    }

    /**
     * Writes the head and a first chunk, and the rest and the end after `probe.nextDelay` ms: past the lease for the
     * first attempt (the capture waits one lease for the end, from the handler's return), at once for the next.
     */
    @Post('late')
    @Idempotent({ lease: LATE_LEASE_MS, ttl: '1h' })
    async late(@Body() body: { label: string }, @TxManager() manager: EntityManager, @Res({ passthrough: true }) res: unknown) {
      await this.effect(manager, 'late', body.label);
      this.writeLate(res, body.label);
    }

    /** The same without the module. */
    @Post('late-plain')
    latePlain(@Body() body: { label: string }, @Res({ passthrough: true }) res: unknown) {
      probe.record(`late-plain:${body.label}`);
      this.writeLate(res, body.label);
    }

    private writeLate(res: unknown, label: string) {
      const raw = writeHead(res, label);
      raw.write(bufferChunk(label));
      const finish = () => {
        raw.write(textChunk);
        raw.end(lastChunk(label));
      };
      const delay = probe.nextDelay(label);
      if (delay === 0) finish();
      else setTimeout(finish, delay);
    }
  }
  return RawController;
}

interface RawApp {
  app: INestApplication;
  url: string;
  probe: Probe;
  logs: CapturingNestLogger;
}

async function startRawApp(adapter: AdapterName, schema: string): Promise<RawApp> {
  const probe = new Probe();
  const logs = new CapturingNestLogger();
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({
        tenant: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'],
        sweep: false,
        replayHeaders: [BEFORE, IN_HEAD],
        ...keyTableOptions(),
      }),
    ],
    controllers: [controller(probe)],
  })
  class RawModule {}
  const options = { logger: logs, abortOnError: false };
  const app =
    adapter === 'express'
      ? await NestFactory.create(RawModule, new ExpressAdapter(), options)
      : // Closed with its connections: a request the app leaves unanswered must not keep the suite from ending.
        await NestFactory.create(RawModule, new FastifyAdapter({ forceCloseConnections: true }), options);
  app.useGlobalInterceptors(lateReply(probe));
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, probe, logs };
}

/** A request's answer, or a failure after ANSWER_TIMEOUT_MS: a request the server never answers fails the test, not Jest's timeout. */
const ANSWER_TIMEOUT_MS = 4_000;
function answerOf(request: Promise<RawResponse>): Promise<RawResponse> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ANSWER_TIMEOUT_MS} ms`)), ANSWER_TIMEOUT_MS);
  });
  return Promise.race([request, timeout]).finally(() => clearTimeout(timer));
}

/** The headers the module stores (docs/requests.md: Content-Type, Location, the allowlist), as the client got them. */
function storedHeadersOf(response: RawResponse): Record<string, unknown> {
  const pick = (name: string) => response.headers[name.toLowerCase()];
  return { 'content-type': pick('Content-Type'), location: pick('Location'), [BEFORE]: pick(BEFORE), [IN_HEAD]: pick(IN_HEAD) };
}

describe.each(ADAPTERS)('responses the app writes itself (%s)', (adapter) => {
  let api: RawApp;
  let db: pg.Client;
  let n = 0;
  const fresh = (what: string) => `${what}-${adapter}-${Date.now()}-${++n}`;
  const effects = async (route: string, label: string) =>
    Number(
      (await db.query<{ n: string }>('SELECT count(*) AS n FROM effects WHERE tenant = $1 AND label = $2', [route, label]))
        .rows[0].n,
    );
  const keyRow = async (key: string) =>
    (
      await db.query<{ status: string; response_status: number | null; response_headers: unknown; response_body: Buffer | null }>(
        'SELECT status, response_status, response_headers, response_body FROM idempotency_keys WHERE tenant_id = $1 AND key = $2',
        ['tenant-a', key],
      )
    ).rows[0];

  beforeAll(async () => {
    const schema = await freshSchema(`raw_responses_${adapter}`);
    await createTables(schema);
    db = await sqlClient(schema);
    api = await startRawApp(adapter, schema);
  });

  afterAll(async () => {
    await api?.app.close();
    await db?.end();
  });

  it('stores and replays what the handler wrote, byte for byte, as the app answers without the module', async () => {
    const label = fresh('written');
    const key = `k-${label}`;
    const first = await answerOf(post(api.url, '/raw/written', { label }, key));
    const replay = await answerOf(post(api.url, '/raw/written', { label }, key));
    const plain = await answerOf(post(api.url, '/raw/written-plain', { label }, undefined));

    // The status given to writeHead, and every chunk in order: the Buffer's bytes as they are (a NUL, 0xff), the
    // string's as UTF-8 (Node's default encoding for write), the last one given to end.
    expect(first.status).toBe(201);
    expect(first.body.equals(fullBody(label))).toBe(true);
    expect(storedHeadersOf(first)).toEqual({
      'content-type': 'text/plain; charset=utf-8',
      location: `/raw/${label}`,
      [BEFORE]: 'before',
      [IN_HEAD]: 'in-head',
    });
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    // What was stored is what the client got: the same status and bytes, the stored headers (Content-Type, Location
    // and the allowlist, docs/requests.md) in the order the app set them, those given to writeHead last.
    const row = await keyRow(key);
    expect(row?.status).toBe('completed');
    expect(row?.response_status).toBe(201);
    expect(row?.response_body?.equals(fullBody(label))).toBe(true);
    expect((row?.response_headers as Array<[string, string]>).map(([name, value]) => [name.toLowerCase(), value])).toEqual([
      ['content-type', 'text/plain; charset=utf-8'],
      ['x-set-before', 'before'],
      ['location', `/raw/${label}`],
      ['x-given-to-writehead', 'in-head'],
    ]);

    // The replay: the stored response, indistinguishable from the first apart from the module's header (CONTRACT A4.8).
    expect(replay.status).toBe(first.status);
    expect(replay.body.equals(first.body)).toBe(true);
    expect(storedHeadersOf(replay)).toEqual(storedHeadersOf(first));
    expect(replay.headers['idempotent-replayed']).toBe('true');

    // The module changes nothing the app answers (A4.8): the same route without it answers the same.
    expect(plain.status).toBe(first.status);
    expect(plain.body.equals(first.body)).toBe(true);
    expect(storedHeadersOf(plain)).toEqual(storedHeadersOf(first));

    // The handler ran once, and its write committed once.
    expect(api.probe.count(`written:${label}`)).toBe(1);
    expect(await effects('written', label)).toBe(1);
  });

  it('refuses a response past maxResponseBytes with the problem, rolls back, releases the key; a retry is refused the same', async () => {
    const label = fresh('too-large');
    const key = `k-${label}`;
    const from = api.logs.lines.length;
    const first = await answerOf(post(api.url, '/raw/too-large', { label }, key));
    const retry = await answerOf(post(api.url, '/raw/too-large', { label }, key));

    for (const answer of [first, retry]) {
      // docs/errors.md: a 500 `response-too-large` problem (application/problem+json, RFC 9457) naming the route and
      // the option, in place of the app's 201 (problemFor in http-failures.ts, sent by the capture's replace).
      expect(answer.status).toBe(500);
      expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
      const problem = answer.json<{ type: string; status: number; detail: string }>();
      expect(problem.type).toBe(TOO_LARGE);
      expect(problem.status).toBe(500);
      expect(problem.detail).toContain(`maxResponseBytes (${MAX_BYTES} bytes)`);
      // Nothing of the app's response reaches the client: not its bytes, not the headers it set for its body.
      expect(answer.text()).not.toContain(label);
      expect(answer.headers.location).toBeUndefined();
      expect(answer.headers[IN_HEAD.toLowerCase()]).toBeUndefined();
      // Never stored, so never a replay.
      expect(answer.headers['idempotent-replayed']).toBeUndefined();
    }
    // An UnreplayableResponseError is `release` (readHttpFailure): the work rolled back (no effect row), the key deleted,
    // so the retry ran the handler again at once instead of a 409 or a replay, and was refused again.
    expect(api.probe.count(`too-large:${label}`)).toBe(2);
    expect(await effects('too-large', label)).toBe(0);
    expect(await keyRow(key)).toBeUndefined();
    // Logged as the module's error (messages.log.responseTooLarge), without the key or anything of the body.
    const logged = api.logs.lines.slice(from);
    expect(logged.filter((line) => line.startsWith('error:') && line.includes('maxResponseBytes'))).toHaveLength(2);
    for (const line of logged) {
      expect(line).not.toContain(label);
      expect(line).not.toContain('zweiter Teil');
    }
  });

  it('keeps the key of a response not ended within the lease: the first client gets a problem, never the success; a retry a 409 meanwhile', async () => {
    const label = fresh('late');
    const key = `k-${label}`;
    const plainLabel = `${label}-plain`;
    api.probe.delays.set(label, [LATE_END_MS, 0]);
    api.probe.delays.set(plainLabel, [LATE_END_MS]);
    const from = api.logs.lines.length;
    const started = Date.now();
    const firstAnswer = answerOf(post(api.url, '/raw/late', { label }, key));
    const plainAnswer = answerOf(post(api.url, '/raw/late-plain', { label: plainLabel }, undefined));
    // While the capture waits for the end (the heartbeat renews the lease), then after it gave up (the key kept until
    // the lease ends): both times the first attempt holds the key.
    await sleep(LATE_LEASE_MS / 2);
    const waiting = await answerOf(post(api.url, '/raw/late', { label }, key));
    await sleep(LATE_LEASE_MS / 2 + 100);
    const kept = await answerOf(post(api.url, '/raw/late', { label }, key));
    const keptAt = Date.now() - started;
    const first = await firstAnswer;
    const plain = await plainAnswer;

    // Without the module the app answers its late response whole: 201, every chunk.
    expect(plain.status).toBe(201);
    expect(plain.body.equals(fullBody(plainLabel))).toBe(true);

    for (const retry of [waiting, kept]) {
      // CONTRACT A3.4: in flight, lease valid: 409 conflict with Retry-After (at least 1).
      expect(retry.status).toBe(409);
      expect(retry.json<{ type: string }>().type).toBe(CONFLICT);
      expect(Number(retry.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    expect(keptAt).toBeLessThan(LATE_END_MS);
    // The capture waits one lease for the end (HttpTransport.invoke: wire.sent(leaseMs)), then gives up
    // (ResponseNotSentError, 'keep' in http-failures.ts): the work rolled back and the key is kept as an unknown
    // outcome (docs/requests.md), so the client must not be told it succeeded (CONTRACT A3.8): no 2xx, and not the
    // body of the rolled-back attempt.
    // The module's 500 `response-not-sent` problem (docs/errors.md), sent in place of the app's response once the app
    // ends it: never the 201 head or a chunk of the rolled-back attempt.
    expect(first.status).toBe(500);
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(first.json<{ type: string }>().type).toBe(NOT_SENT);
    expect(first.headers.location).toBeUndefined();
    expect(first.text()).not.toContain(`first:${label}`);
    // Logged once as the module's error, naming the route's lease (messages.log.responseNotSent); not a store failure.
    const notSent = api.logs.lines.slice(from).filter((line) => line.startsWith('error:'));
    expect(notSent.filter((line) => line.includes(`not ended within its lease (${LATE_LEASE_MS} ms)`))).toHaveLength(1);
    expect(notSent.filter((line) => line.includes('store failed'))).toEqual([]);
    // The handler ran once while the first attempt held the key; its effect rolled back; the key is in flight.
    expect(api.probe.count(`late:${label}`)).toBe(1);
    expect(await effects('late', label)).toBe(0);
    expect((await keyRow(key))?.status).toBe('in_flight');
    // Whatever the module logged of it, no key and nothing of the body (docs/errors.md).
    for (const line of api.logs.lines.slice(from)) {
      expect(line).not.toContain(label);
      expect(line).not.toContain('zweiter Teil');
    }

    // Once the lease has ended a retry takes the key over and runs again; this time the handler ends at once.
    await sleep(Math.max(0, LATE_END_MS + REPLY_AFTER_END_MS - (Date.now() - started)));
    const later = await answerOf(post(api.url, '/raw/late', { label }, key));
    const replay = await answerOf(post(api.url, '/raw/late', { label }, key));
    expect(later.status).toBe(201);
    expect(later.body.equals(fullBody(label))).toBe(true);
    expect(replay.status).toBe(201);
    expect(replay.body.equals(later.body)).toBe(true);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(api.probe.count(`late:${label}`)).toBe(2);
    expect(await effects('late', label)).toBe(1);
  });
});
