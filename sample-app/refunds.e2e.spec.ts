import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication, LoggerService } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import amqp, { type Channel, type ChannelModel } from 'amqplib';
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { connect, headers as natsHeaders, type NatsConnection } from '@nats-io/transport-node';
import type pg from 'pg';
import { describeWithBroker, NATS_URL, RABBITMQ_URL, waitFor } from '../test/support/brokers.js';
import { databaseUrl, freshSchema, sqlClient } from '../test/support/database.js';
import { send, sleep, type RawResponse } from '../test/support/http.js';
import { CapturingNestLogger } from '../test/real-app/log-capture.js';
import { loadConfig, type HttpAdapterName } from './config.js';
import { createSampleApp } from './create-app.js';
import { deadLetterStream, REFUND_CONSUMER } from './refunds/jetstream.js';
import { deadLetterQueue } from './refunds/rabbitmq.js';

const ADAPTERS: HttpAdapterName[] = ['express', 'fastify'];
const KEY_A = 'demo-key-tenant-a';
const REQUEST_REFUND = `mutation ($input: RequestRefundInput!) {
  requestRefund(input: $input) { id refundId chargeId amount status source created }
}`;

async function startSampleApp(
  adapter: HttpAdapterName,
  schema: string,
  env: Record<string, string> = {},
  logger?: LoggerService,
) {
  const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: databaseUrl(), ...env });
  const app = await createSampleApp({ ...config, databaseUrl: databaseUrl(), databaseSchema: schema, logger: false }, { logger });
  await app.listen(0, '127.0.0.1');
  return { app, url: (await app.getUrl()).replace('[::1]', '127.0.0.1') };
}

/** A charge of tenant-a to refund, made through the API. */
async function createCharge(url: string, amount = 2_500): Promise<string> {
  const res = await send(url, 'POST', '/charges', {
    headers: [
      ['Authorization', `Bearer ${KEY_A}`],
      ['Idempotency-Key', randomUUID()],
    ],
    body: { amount, currency: 'usd', customer: 'cus_refunds' },
  });
  expect(res.status).toBe(201);
  return res.json().id as string;
}

/**
 * The GraphQL request of docs/sample-app.md's walkthrough, read from the document: the
 * curl command's headers and `-d` payload, and the answer printed under it.
 */
async function documentedRefundRequest(): Promise<{
  headers: Array<[string, string]>;
  payload: { query: string; variables: { input: Record<string, unknown> } };
  answer: { data: { requestRefund: Record<string, unknown> } };
}> {
  const doc = await readFile(new URL('../docs/sample-app.md', import.meta.url), 'utf8');
  // The walkthrough's shell variables: A='Authorization: ...'; J='Content-Type: ...'
  const shell = Object.fromEntries([...doc.matchAll(/(?:^|; )([A-Z])='([^']*)'/gm)].map((m) => [m[1], m[2]]));
  const command = /^curl -s localhost:3000\/graphql (.*) \\\n {2}-d '(\{"query":"mutation.*)'\n((?:# .*\n)+)/m.exec(doc);
  if (!command) throw new Error('docs/sample-app.md has no `curl ... /graphql` command sending the mutation');
  const headers = [...command[1].matchAll(/-H (?:"\$(\w)"|'([^']*)')/g)].map((m) => {
    const header = m[1] ? shell[m[1]] : m[2];
    const colon = header.indexOf(': ');
    return [header.slice(0, colon), header.slice(colon + 2)] as [string, string];
  });
  // The answer: the `# {"data"...` line and the `#  ` lines continuing it.
  const lines = command[3].split('\n');
  const start = lines.findIndex((line) => line.startsWith('# {"data"'));
  const next = lines.findIndex((line, index) => index > start && !line.startsWith('#  '));
  const printed = lines.slice(start, next);
  const answer = JSON.parse(printed.map((line) => line.replace(/^# ?/, '').trim()).join(''));
  return { headers, payload: JSON.parse(command[2]), answer };
}

describe.each(ADAPTERS)('sample refunds over GraphQL (%s)', (adapter) => {
  let api: { app: INestApplication; url: string };
  let db: pg.Client;
  const logs = new CapturingNestLogger();

  beforeAll(async () => {
    const schema = await freshSchema(`sample_refunds_${adapter}`);
    // Apollo reads NODE_ENV once, at start, to decide on stack traces in answers: Jest sets 'test', `npm run sample` nothing.
    const nodeEnv = process.env.NODE_ENV;
    delete process.env.NODE_ENV;
    try {
      api = await startSampleApp(adapter, schema, {}, logs);
    } finally {
      process.env.NODE_ENV = nodeEnv;
    }
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await api?.app.close();
    await db?.end();
  });

  const requestRefund = (input: unknown, key: string | undefined, apiKey: string | null = KEY_A): Promise<RawResponse> => {
    const headers: Array<[string, string]> = [];
    if (apiKey) headers.push(['Authorization', `Bearer ${apiKey}`]);
    if (key) headers.push(['Idempotency-Key', key]);
    return send(api.url, 'POST', '/graphql', { headers, body: { query: REQUEST_REFUND, variables: { input } } });
  };
  const refundRows = async (refundId: string) =>
    Number((await db.query('SELECT count(*) FROM refunds WHERE refund_id = $1', [refundId])).rows[0].count);

  it('starts without a broker without mapping the message consumer: no empty `RefundRequestsConsumer {/}` line', () => {
    expect(logs.lines).toContainEqual(expect.stringMatching(/^log: ChargesController \{\/charges\}/));
    expect(logs.lines.filter((line) => line.includes('RefundRequestsConsumer'))).toEqual([]);
  });

  it('refunds once per key, replays the same refund on a retry, and marks the replay', async () => {
    const chargeId = await createCharge(api.url);
    const input = { refundId: `rf-${randomUUID()}`, chargeId, amount: 1_000 };
    const key = randomUUID();
    const first = await requestRefund(input, key);
    const retry = await requestRefund(input, key);
    expect(first.json().errors).toBeUndefined();
    expect(first.json().data.requestRefund).toMatchObject({ ...input, status: 'refunded', source: 'graphql' });
    expect(retry.json()).toEqual(first.json());
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(await refundRows(input.refundId)).toBe(1);
  });

  it('refunds a refund id once for ever: a new key for the same refund id finds it in the effect ledger', async () => {
    const chargeId = await createCharge(api.url);
    const input = { refundId: `rf-${randomUUID()}`, chargeId, amount: 700 };
    const first = await requestRefund(input, randomUUID());
    const again = await requestRefund(input, randomUUID());
    expect(again.json().data.requestRefund).toMatchObject({ id: first.json().data.requestRefund.id, status: 'already-refunded' });
    expect(await refundRows(input.refundId)).toBe(1);
  });

  it('answers a refund of an unknown charge with a GraphQL error that is stored and replayed', async () => {
    const input = { refundId: `rf-${randomUUID()}`, chargeId: 'ch_missing', amount: 1 };
    const key = randomUUID();
    const first = await requestRefund(input, key);
    const retry = await requestRefund(input, key);
    expect(first.json().errors[0].extensions.code).toBe('CHARGE_NOT_FOUND');
    expect(retry.json()).toEqual(first.json());
    // The refusal rolled the ledger row back with everything else: the id is still free.
    expect(
      (await db.query('SELECT count(*) FROM effect_ledger WHERE key = $1', [`refund:${input.refundId}`])).rows[0].count,
    ).toBe('0');
  });

  it('needs an idempotency key and an API key, and refunds nothing without them', async () => {
    const chargeId = await createCharge(api.url);
    const input = { refundId: `rf-${randomUUID()}`, chargeId, amount: 1 };
    const noKey = await requestRefund(input, undefined);
    expect(noKey.json().errors[0].extensions).toMatchObject({ code: 'MISSING_KEY', status: 400 });
    const noAuth = await requestRefund(input, randomUUID(), null);
    expect(noAuth.json().errors).toHaveLength(1);
    expect(noAuth.json().data).toBeNull();
    expect(await refundRows(input.refundId)).toBe(0);
  });

  it("answers the walkthrough's GraphQL request as docs/sample-app.md shows, and its repetition as a replay", async () => {
    const { headers, payload, answer } = await documentedRefundRequest();
    // The document's chargeId is the walkthrough's first charge; here, a charge of this run.
    const chargeId = await createCharge(api.url);
    const body = { ...payload, variables: { input: { ...payload.variables.input, chargeId } } };
    const first = await send(api.url, 'POST', '/graphql', { headers, body });
    expect(first.json()).toEqual({
      data: {
        requestRefund: {
          ...answer.data.requestRefund,
          id: expect.stringMatching(/^re_[0-9a-f]{24}$/),
          chargeId,
          created: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
        },
      },
    });
    const again = await send(api.url, 'POST', '/graphql', { headers, body });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json()).toEqual(first.json());
    expect(await refundRows(String(payload.variables.input.refundId))).toBe(1);
    const withoutKey = headers.filter(([name]) => name.toLowerCase() !== 'idempotency-key');
    expect((await send(api.url, 'POST', '/graphql', { headers: withoutKey, body })).json()).toMatchObject({
      errors: [
        { message: 'This endpoint requires an Idempotency-Key header.', extensions: { code: 'MISSING_KEY', status: 400 } },
      ],
      data: null,
    });
  });

  it("answers a client's mistakes without a stack trace and logs none of them as a server error", async () => {
    const chargeId = await createCharge(api.url);
    const input = { refundId: `rf-${randomUUID()}`, chargeId, amount: 1 };
    const key = randomUUID();
    const before = logs.lines.length;
    const answers = [
      await requestRefund(input, undefined),
      await requestRefund(input, 'a,b'),
      await requestRefund(input, key),
      await requestRefund({ ...input, amount: 2 }, key),
      await requestRefund({ refundId: `rf-${randomUUID()}`, chargeId: 'ch_missing', amount: 1 }, randomUUID()),
    ];
    expect(answers.map((res) => res.json().errors?.[0]?.extensions?.code)).toEqual([
      'MISSING_KEY',
      'INVALID_KEY',
      undefined,
      'MISMATCH',
      'CHARGE_NOT_FOUND',
    ]);
    for (const res of answers) {
      expect(res.text()).not.toContain('stacktrace');
      expect(res.text()).not.toMatch(/\bat .*\.(ts|js):\d+/);
    }
    // The refusal of an unknown charge is the resolver's own, which Nest logs as it logs any resolver error.
    expect(
      logs.lines
        .slice(before)
        .filter((line) => /^(error|fatal|warn):/.test(line))
        .filter((line) => !line.includes('ch_missing')),
    ).toEqual([]);
  });
});

describeWithBroker('rabbitmq', 'sample refund requests over RabbitMQ', () => {
  let api: { app: INestApplication; url: string };
  let db: pg.Client;
  let connection: ChannelModel;
  let channel: Channel;
  const queue = `sample-refunds-${randomUUID().slice(0, 8)}`;

  beforeAll(async () => {
    const schema = await freshSchema('sample_refunds_rabbitmq');
    api = await startSampleApp('express', schema, { RABBITMQ_URL, REFUND_QUEUE: queue });
    db = await sqlClient(schema);
    connection = await amqp.connect(RABBITMQ_URL);
    channel = await connection.createChannel();
  });
  afterAll(async () => {
    await api?.app.close();
    await channel?.deleteQueue(queue).catch(() => undefined);
    await channel?.deleteQueue(deadLetterQueue(queue)).catch(() => undefined);
    await connection?.close();
    await db?.end();
  });

  const publish = (data: Record<string, unknown>, messageId?: string) =>
    channel.sendToQueue(
      queue,
      Buffer.from(JSON.stringify({ pattern: 'refund.requested', data })),
      messageId ? { messageId } : {},
    );
  const refunds = async (refundId: string) =>
    (await db.query('SELECT source FROM refunds WHERE refund_id = $1', [refundId])).rows as Array<{ source: string }>;
  const keyStatus = async (key: string) =>
    (await db.query('SELECT status FROM idempotency_keys WHERE key = $1', [key])).rows[0]?.status as string | undefined;
  const deadLetters = async () => (await channel.checkQueue(deadLetterQueue(queue))).messageCount;

  it('refunds a requested refund once, however often the request is delivered', async () => {
    const chargeId = await createCharge(api.url);
    const refundId = `rf-${randomUUID()}`;
    const message = { tenant: 'tenant-a', refundId, chargeId, amount: 300 };
    for (let i = 0; i < 3; i++) publish(message, `msg-${refundId}`);
    expect(await waitFor(async () => (await keyStatus(`msg-${refundId}`)) === 'completed')).toBe(true);
    expect(await waitFor(async () => (await channel.checkQueue(queue)).messageCount === 0)).toBe(true);
    expect(await refunds(refundId)).toEqual([{ source: 'message' }]);
  });

  it('refunds a refund id once whether it comes as a message or as a mutation', async () => {
    const chargeId = await createCharge(api.url);
    const refundId = `rf-${randomUUID()}`;
    publish({ tenant: 'tenant-a', refundId, chargeId, amount: 300 }, `msg-${refundId}`);
    expect(await waitFor(async () => (await keyStatus(`msg-${refundId}`)) === 'completed')).toBe(true);
    const viaGraphQL = await send(api.url, 'POST', '/graphql', {
      headers: [
        ['Authorization', `Bearer ${KEY_A}`],
        ['Idempotency-Key', randomUUID()],
      ],
      body: { query: REQUEST_REFUND, variables: { input: { refundId, chargeId, amount: 300 } } },
    });
    expect(viaGraphQL.json().data.requestRefund).toMatchObject({ status: 'already-refunded', source: 'message' });
    expect(await refunds(refundId)).toEqual([{ source: 'message' }]);
  });

  it('dead-letters a request without a message id, and one the validation pipe refuses', async () => {
    const chargeId = await createCharge(api.url);
    const before = await deadLetters();
    publish({ tenant: 'tenant-a', refundId: `rf-${randomUUID()}`, chargeId, amount: 1 });
    expect(await waitFor(async () => (await deadLetters()) === before + 1)).toBe(true);
    // An invalid request (no amount) is refused by the validation pipe before the handler: dead-lettered, never retried.
    publish({ tenant: 'tenant-a', refundId: `rf-${randomUUID()}`, chargeId }, `msg-${randomUUID()}`);
    expect(await waitFor(async () => (await deadLetters()) === before + 2)).toBe(true);
  });

  it('validates the nested simulate object: an unknown crash point or field is dead-lettered, and refunds nothing', async () => {
    const chargeId = await createCharge(api.url);
    const before = await deadLetters();
    const invalid = [{ crash: 'on-tuesdays' }, { crash: 'before-commit', explode: true }, { delayMs: -1 }];
    const refundIds = invalid.map(() => `rf-${randomUUID()}`);
    invalid.forEach((simulate, i) =>
      publish({ tenant: 'tenant-a', refundId: refundIds[i], chargeId, amount: 1, simulate }, `msg-${refundIds[i]}`),
    );
    expect(await waitFor(async () => (await deadLetters()) === before + invalid.length)).toBe(true);
    for (const refundId of refundIds) {
      expect(await refunds(refundId)).toEqual([]);
      // Refused before the handler ran: the key was released, so a corrected request may use it at once.
      expect(await keyStatus(`msg-${refundId}`)).toBeUndefined();
    }
  });
});

describeWithBroker('nats', 'sample refund requests over NATS JetStream', () => {
  let api: { app: INestApplication; url: string };
  let db: pg.Client;
  let nats: NatsConnection;
  let manager: JetStreamManager;
  // A stream and subject of this run's own: NATS refuses two streams with overlapping subjects.
  const id = randomUUID().slice(0, 8);
  const stream = `SAMPLE_REFUNDS_${id}`;
  const subject = `sample-${id}.refund.requested`;

  beforeAll(async () => {
    const schema = await freshSchema('sample_refunds_jetstream');
    api = await startSampleApp('fastify', schema, { NATS_URL, REFUND_STREAM: stream, REFUND_SUBJECT: subject });
    db = await sqlClient(schema);
    nats = await connect({ servers: NATS_URL });
    manager = await jetstreamManager(nats);
  });
  afterAll(async () => {
    await api?.app.close();
    await manager?.streams.delete(stream).catch(() => undefined);
    await manager?.streams.delete(deadLetterStream(stream)).catch(() => undefined);
    await nats?.close();
    await db?.end();
  });

  /** Publishes a refund request with its key as `Nats-Msg-Id`; JetStream's answer says where it is stored, or that it deduplicated it. */
  const publish = async (data: Record<string, unknown>, messageId: string) => {
    const h = natsHeaders();
    h.set('Nats-Msg-Id', messageId);
    return manager.jetstream().publish(subject, JSON.stringify(data), { headers: h });
  };
  const refunds = async (refundId: string) =>
    (await db.query('SELECT source FROM refunds WHERE refund_id = $1', [refundId])).rows as Array<{ source: string }>;
  const keyRow = async (key: string) =>
    (await db.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0] as
      { status: string; attempt: number } | undefined;
  /** The consumer has acknowledged (or terminated) every message of the stream up to `seq`, and holds none. */
  const settledThrough = async (seq: number) => {
    const info = await manager.consumers.info(stream, REFUND_CONSUMER);
    return info.ack_floor.stream_seq >= seq && info.num_ack_pending === 0 && info.num_pending === 0;
  };
  const deadLetters = async () => (await manager.streams.info(deadLetterStream(stream))).state.messages;

  it("refunds a request once, keyed by Nats-Msg-Id; a redelivery past JetStream's deduplication refunds nothing more", async () => {
    const chargeId = await createCharge(api.url);
    const refundId = `rf-${randomUUID()}`;
    const message = { tenant: 'tenant-a', refundId, chargeId, amount: 400 };
    const key = `nats-${refundId}`;
    const first = await publish(message, key);
    expect(await waitFor(() => settledThrough(first.seq))).toBe(true);
    expect(await refunds(refundId)).toEqual([{ source: 'message' }]);
    expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });

    // JetStream drops a publish with a Nats-Msg-Id it saw within the stream's duplicate window; past it (here shortened
    // to its minimum) the same request is stored and delivered again, as a publisher's late retry would be.
    await manager.streams.update(stream, { duplicate_window: 100_000_000 });
    let again = await publish(message, key);
    const deadline = Date.now() + 10_000;
    while (again.duplicate && Date.now() < deadline) {
      await sleep(50);
      again = await publish(message, key);
    }
    expect(again.duplicate).toBe(false);
    expect(await waitFor(() => settledThrough(again.seq))).toBe(true);
    // Acknowledged as a replay of the completed key: no second refund, no second attempt, nothing dead-lettered.
    expect(await refunds(refundId)).toEqual([{ source: 'message' }]);
    expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });
    expect(await deadLetters()).toBe(0);
  });

  it('refuses at start-up a stream name or a subject NATS would not take, naming the variable', () => {
    expect(() => loadConfig({ REFUND_STREAM: 'REFUNDS.v2' })).toThrow(/^REFUND_STREAM must be/);
    expect(() => loadConfig({ REFUND_SUBJECT: 'refund.*' })).toThrow(/^REFUND_SUBJECT must be/);
    expect(() => loadConfig({ REFUND_SUBJECT: 'refund..requested' })).toThrow(/^REFUND_SUBJECT must be/);
    expect(loadConfig({})).toMatchObject({ natsUrl: undefined, refundStream: 'REFUNDS', refundSubject: 'refund.requested' });
  });

  it('dead-letters a request with an unknown simulate.crash to the dead-letter stream, and refunds nothing', async () => {
    const chargeId = await createCharge(api.url);
    const refundId = `rf-${randomUUID()}`;
    const before = await deadLetters();
    const published = await publish(
      { tenant: 'tenant-a', refundId, chargeId, amount: 1, simulate: { crash: 'on-tuesdays' } },
      `nats-${refundId}`,
    );
    expect(await waitFor(async () => (await deadLetters()) === before + 1)).toBe(true);
    expect(await waitFor(() => settledThrough(published.seq))).toBe(true);
    expect(await refunds(refundId)).toEqual([]);
    expect(await keyRow(`nats-${refundId}`)).toBeUndefined();
  });
});
