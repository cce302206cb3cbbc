import { afterAll, afterEach, beforeAll, beforeEach, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import { AckPolicy, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { connect, headers as natsHeaders, type NatsConnection } from '@nats-io/transport-node';
import { deadLetterStream, REFUND_CONSUMER } from '../../sample-app/refunds/jetstream.js';
import { describeWithBroker, NATS_URL, waitFor } from '../support/brokers.js';
import { send, sleep } from '../support/http.js';
import { API_KEY } from './support/charges.js';
import { printFigures } from './support/figures.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/** Short enough to wait out. */
const LEASE_MS = 2_000;
/**
 * How long JetStream waits for an acknowledgement before it delivers a
 * message again: the sample's consumer is created with 30 s; this scenario
 * creates it first with less, and the sample uses an existing one as it is.
 */
const ACK_WAIT_MS = 2_000;
const DEADLINE_MS = 30_000;

/**
 * The sample's JetStream consumer (NATS_URL, the library's JetStreamServer)
 * as real processes killed with SIGKILL around the commit: JetStream itself
 * redelivers the stored message, with its Nats-Msg-Id, once ack_wait has
 * passed without an acknowledgement. Refunds counted in PostgreSQL.
 */
describeWithBroker('nats', 'the sample consuming refund requests from NATS JetStream, real processes', () => {
  let db: ScenarioDatabase;
  let nats: NatsConnection;
  let manager: JetStreamManager;
  let fleet: Fleet;
  let stream: string;
  let subject: string;
  let chargeId: string;

  const start = (name: string, faults: boolean, adapter: 'express' | 'fastify' = 'express') =>
    fleet.start({
      name,
      adapter,
      databaseUrl: db.url,
      env: {
        NATS_URL,
        REFUND_STREAM: stream,
        REFUND_SUBJECT: subject,
        IDEMPOTENCY_LEASE_MS: String(LEASE_MS),
        ...(faults ? { SAMPLE_FAULT_INJECTION: '1' } : {}),
      },
    });
  const publish = async (data: Record<string, unknown>, messageId: string) => {
    const h = natsHeaders();
    h.set('Nats-Msg-Id', messageId);
    return manager.jetstream().publish(subject, JSON.stringify(data), { headers: h });
  };
  const refunds = async (refundId: string) =>
    Number((await db.client.query('SELECT count(*) FROM refunds WHERE refund_id = $1', [refundId])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.client.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0] as
      { status: string; attempt: number } | undefined;
  const consumerInfo = () => manager.consumers.info(stream, REFUND_CONSUMER);
  /** Every message of the stream up to `seq` acknowledged (or terminated), none waiting or unacknowledged. */
  const settledThrough = async (seq: number) => {
    const info = await consumerInfo();
    return info.ack_floor.stream_seq >= seq && info.num_ack_pending === 0 && info.num_pending === 0;
  };
  const deadLetters = async () => (await manager.streams.info(deadLetterStream(stream))).state.messages;
  const exitOf = (process: SampleProcess) => Promise.race([process.exited, sleep(DEADLINE_MS).then(() => 'still running')]);
  const refundRequest = (refundId: string, simulate: Record<string, unknown>) => ({
    tenant: 'tenant-a',
    refundId,
    chargeId,
    amount: 100,
    simulate,
  });

  beforeAll(async () => {
    db = await ScenarioDatabase.create(`consumers_jetstream_${randomUUID().slice(0, 8)}`);
    nats = await connect({ servers: NATS_URL });
    manager = await jetstreamManager(nats);
  });
  afterAll(async () => {
    await nats?.close().catch(() => undefined);
    await db?.drop();
  });

  // A stream and processes per scenario; subjects of this run's own, as NATS refuses streams with overlapping ones.
  beforeEach(async () => {
    const id = randomUUID().slice(0, 8);
    stream = `RELIABILITY_REFUNDS_${id}`;
    subject = `reliability-${id}.refund.requested`;
    await manager.streams.add({ name: stream, subjects: [subject] });
    await manager.consumers.add(stream, {
      durable_name: REFUND_CONSUMER,
      ack_policy: AckPolicy.Explicit,
      ack_wait: ACK_WAIT_MS * 1_000_000,
    });
    fleet = new Fleet();
    const maker = await fleet.start({ name: 'charge-maker', adapter: 'express', databaseUrl: db.url });
    const res = await send(maker.url, 'POST', '/charges', {
      headers: [
        ['Authorization', `Bearer ${API_KEY}`],
        ['Idempotency-Key', randomUUID()],
      ],
      body: { amount: 100_000, currency: 'eur', customer: 'cus_refunds_jetstream' },
    });
    expect(res.status).toBe(201);
    chargeId = res.json().id as string;
    await maker.stop();
  });
  afterEach(async () => {
    await fleet?.stopAll();
    await manager.streams.delete(stream).catch(() => undefined);
    await manager.streams.delete(deadLetterStream(stream)).catch(() => undefined);
  });

  it("SIGKILL after the commit, before the ack: JetStream's redelivery (same Nats-Msg-Id) is acknowledged as a replay, one refund", () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `nats-${refundId}`;
      const doomed = await start('crash-after-commit', true);
      const published = await publish(refundRequest(refundId, { crash: 'after-commit' }), key);
      expect(await exitOf(doomed)).toEqual({ code: null, signal: 'SIGKILL' });
      // It died acknowledging: the refund and the completion had committed, JetStream still waits for the ack.
      const refundsAtCrash = await refunds(refundId);
      expect(refundsAtCrash).toBe(1);
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });
      expect((await consumerInfo()).ack_floor.stream_seq).toBeLessThan(published.seq);

      const survivor = await start('survivor', false, 'fastify');
      expect(await waitFor(() => settledThrough(published.seq), DEADLINE_MS)).toBe(true);
      // Delivered again (the stored message, after ack_wait), refunded once, its key untouched.
      expect((await consumerInfo()).delivered.consumer_seq).toBeGreaterThanOrEqual(2);
      expect(await refunds(refundId)).toBe(1);
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });
      expect(await deadLetters()).toBe(0);
      expect(survivor.alive).toBe(true);
      printFigures('consumers-jetstream/crash-after-commit', {
        refundsAtCrash,
        deliveries: (await consumerInfo()).delivered.consumer_seq,
        refundsInTheEnd: await refunds(refundId),
      });
    }));

  it('SIGKILL after the insert, before the commit: nothing committed; the redelivery takes the key over once its lease ends, one refund', () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `nats-${refundId}`;
      const doomed = await start('crash-before-commit', true);
      const published = await publish(refundRequest(refundId, { crash: 'before-commit' }), key);
      expect(await exitOf(doomed)).toEqual({ code: null, signal: 'SIGKILL' });
      const refundsAtCrash = await refunds(refundId);
      expect(refundsAtCrash).toBe(0);
      expect(await keyRow(key)).toEqual({ status: 'in_flight', attempt: 1 });

      await start('survivor', false, 'fastify');
      expect(await waitFor(async () => (await keyRow(key))?.status === 'completed', DEADLINE_MS)).toBe(true);
      expect(await waitFor(() => settledThrough(published.seq), DEADLINE_MS)).toBe(true);
      expect(await refunds(refundId)).toBe(1);
      // The crashed attempt's claim counted: the redelivery took the key over as attempt 2.
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 2 });
      expect(await deadLetters()).toBe(0);
      printFigures('consumers-jetstream/crash-before-commit', {
        refundsAtCrash,
        deliveries: (await consumerInfo()).delivered.consumer_seq,
        refundsInTheEnd: await refunds(refundId),
        attempts: (await keyRow(key))!.attempt,
      });
    }));
});
