import { randomUUID } from 'node:crypto';
import amqp, { type Channel, type ChannelModel, type ConsumeMessage } from 'amqplib';
import { connect, headers as natsHeaders, type NatsConnection } from '@nats-io/transport-node';
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { describe, it } from '@jest/globals';
import { BROKERS, brokerReachable, displayUrl, NATS_URL, probeBroker, RABBITMQ_URL, type BrokerName } from './broker-probe.js';
import { sleep } from './http.js';

export { NATS_URL, RABBITMQ_URL };

/** The start of the title of the test that stands for a suite that did not run (the not-run reporter looks for it). */
export const NOT_RUN_PREFIX = 'not run: ';

/**
 * `describe(name, body)` for a suite that needs `broker`, where the run's
 * global setup found it. Where it did not, the suite's tests are not
 * registered at all: one test stands in for them, checking that the broker
 * still does not answer, and test/support/not-run-reporter.js names the suite
 * and how to run it at the end of the run. (With REQUIRE_BROKERS set, the
 * global setup has already failed the run.)
 */
export function describeWithBroker(broker: BrokerName, name: string, body: () => void): void {
  if (brokerReachable(broker)) {
    describe(name, body);
    return;
  }
  const { title, url, variable, start } = BROKERS[broker];
  describe(name, () => {
    it(`${NOT_RUN_PREFIX}needs ${title}, which did not answer at ${displayUrl(url)} (${variable}; start one: ${start})`, async () => {
      // The one thing to check here: the setup's finding still holds, so no suite was left out by mistake.
      if (await probeBroker(broker))
        throw new Error(`${title} answers now, but did not when the run started: run the tests again.`);
    });
  });
}

/**
 * One test's RabbitMQ queue and its dead-letter queue, with a publisher
 * channel. The work queue dead-letters rejected messages to `deadLetters`
 * through the default exchange, as an application's queue would be set up.
 */
export class RabbitQueue {
  private constructor(
    readonly name: string,
    readonly deadLetters: string,
    private readonly connection: ChannelModel,
    readonly channel: Channel,
  ) {}

  static async create(prefix: string): Promise<RabbitQueue> {
    const connection = await amqp.connect(RABBITMQ_URL);
    const channel = await connection.createConfirmChannel();
    const name = `${prefix}-${randomUUID().slice(0, 8)}`;
    const queue = new RabbitQueue(name, `${name}.dead`, connection, channel);
    await channel.assertQueue(queue.deadLetters, { durable: false });
    await channel.assertQueue(name, { durable: false, arguments: queue.queueArguments });
    return queue;
  }

  /** The work queue's arguments: what the consumer's `queueOptions` must repeat (RabbitMQ refuses a mismatch). */
  get queueArguments(): Record<string, string> {
    return { 'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': this.deadLetters };
  }

  /** Nest's RMQ transport options for a manually acknowledging consumer of this queue. */
  consumerOptions(): Record<string, unknown> {
    return {
      urls: [RABBITMQ_URL],
      queue: this.name,
      noAck: false,
      queueOptions: { durable: false, arguments: this.queueArguments },
    };
  }

  /** Publishes an event the way Nest's RMQ transport reads it (`{ pattern, data }`), waiting for the broker's confirm. */
  async publish(
    pattern: string,
    data: unknown,
    properties: { messageId?: string; headers?: Record<string, unknown> } = {},
  ): Promise<void> {
    this.channel.sendToQueue(this.name, Buffer.from(JSON.stringify({ pattern, data })), { persistent: false, ...properties });
    await (this.channel as unknown as { waitForConfirms(): Promise<void> }).waitForConfirms();
  }

  /**
   * Sends a `MessagePattern` request and collects the replies it gets within
   * `timeoutMs` (direct reply-to): a reply is `{ response }` or `{ err }`.
   */
  async request(
    pattern: string,
    data: unknown,
    messageId: string,
    timeoutMs = 5_000,
  ): Promise<Array<{ response?: unknown; err?: unknown }>> {
    const replies: Array<{ response?: unknown; err?: unknown }> = [];
    const connection = await amqp.connect(RABBITMQ_URL);
    try {
      const channel = await connection.createChannel();
      const id = randomUUID();
      let done!: () => void;
      const finished = new Promise<void>((resolve) => (done = resolve));
      await channel.consume(
        'amq.rabbitmq.reply-to',
        (message: ConsumeMessage | null) => {
          if (!message) return;
          // Nest's RMQ transport correlates a reply by the request's correlationId, not by an id in the body.
          if (message.properties.correlationId !== id) return;
          const packet = JSON.parse(message.content.toString()) as { response?: unknown; err?: unknown; isDisposed?: boolean };
          if (packet.err !== undefined || packet.response !== undefined)
            replies.push({ response: packet.response, err: packet.err });
          if (packet.isDisposed || packet.err !== undefined) done();
        },
        { noAck: true },
      );
      channel.sendToQueue(this.name, Buffer.from(JSON.stringify({ pattern, data, id })), {
        replyTo: 'amq.rabbitmq.reply-to',
        correlationId: id,
        messageId,
      });
      // A timer of our own, cleared when the replies are in: a bare sleep() kept the worker alive for timeoutMs after
      // the last test, which Jest reported as a worker that failed to exit gracefully.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const timedOut = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
      try {
        await Promise.race([finished, timedOut]);
      } finally {
        clearTimeout(timer);
      }
      return replies;
    } finally {
      await connection.close();
    }
  }

  /** Messages waiting in `queue` (not counting those delivered and unacknowledged). */
  async depth(queue = this.name): Promise<number> {
    return (await this.channel.checkQueue(queue)).messageCount;
  }

  /** Messages waiting or delivered but not acknowledged, and consumers, of the work queue. */
  async waitUntilDrained(timeoutMs = 20_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      // checkQueue counts ready messages only; unacknowledged ones come back on close, so look twice, apart.
      if ((await this.depth()) === 0) {
        await sleep(200);
        if ((await this.depth()) === 0) return true;
      }
      await sleep(100);
    }
    return false;
  }

  /** Takes every message from the dead-letter queue (acknowledged), content parsed. */
  async takeDeadLetters(): Promise<Array<{ content: { pattern: string; data: unknown }; messageId?: string; death?: unknown }>> {
    const taken = [];
    for (;;) {
      const message = await this.channel.get(this.deadLetters, { noAck: true });
      if (!message) return taken;
      taken.push({
        content: JSON.parse(message.content.toString()) as { pattern: string; data: unknown },
        messageId: message.properties.messageId as string | undefined,
        death: message.properties.headers?.['x-death'],
      });
    }
  }

  /** Polls until the dead-letter queue holds `count` messages; false if it did not within `timeoutMs`. */
  async waitForDeadLetters(count: number, timeoutMs = 20_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if ((await this.depth(this.deadLetters)) >= count) return true;
      await sleep(100);
    }
    return false;
  }

  async delete(): Promise<void> {
    await this.channel.deleteQueue(this.name).catch(() => undefined);
    await this.channel.deleteQueue(this.deadLetters).catch(() => undefined);
    await this.connection.close().catch(() => undefined);
  }
}

/** One test's JetStream stream (and a dead-letter stream capturing `dead-letter.<subjects>`). */
export class JetStreamFixture {
  private constructor(
    readonly stream: string,
    readonly subject: string,
    readonly connection: NatsConnection,
    readonly manager: JetStreamManager,
  ) {}

  static async create(prefix: string): Promise<JetStreamFixture> {
    const connection = await connect({ servers: NATS_URL });
    const manager = await jetstreamManager(connection);
    const id = randomUUID().slice(0, 8);
    const stream = `${prefix}_${id}`.toUpperCase().replace(/[^A-Z0-9_]/g, '_');
    const fixture = new JetStreamFixture(stream, `${prefix}.${id}`, connection, manager);
    await manager.streams.add({ name: stream, subjects: [`${fixture.subject}.>`] });
    await manager.streams.add({ name: `${stream}_DEAD`, subjects: [`dead-letter.${fixture.subject}.>`] });
    return fixture;
  }

  /** Publishes JSON to the stream, with a `Nats-Msg-Id` when given (which JetStream also deduplicates publishes by). */
  async publish(subject: string, data: unknown, messageId?: string): Promise<{ duplicate: boolean }> {
    const h = natsHeaders();
    if (messageId) h.set('Nats-Msg-Id', messageId);
    const js = this.manager.jetstream();
    const ack = await js.publish(subject, JSON.stringify(data), { headers: h });
    return { duplicate: ack.duplicate };
  }

  async deadLetterCount(): Promise<number> {
    return (await this.manager.streams.info(`${this.stream}_DEAD`)).state.messages;
  }

  /** Acknowledgements the consumer still waits for, and messages not yet delivered. */
  async pending(consumer: string): Promise<{ ackPending: number; notDelivered: number }> {
    const info = await this.manager.consumers.info(this.stream, consumer);
    return { ackPending: info.num_ack_pending, notDelivered: info.num_pending };
  }

  async waitUntilSettled(consumer: string, timeoutMs = 20_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const { ackPending, notDelivered } = await this.pending(consumer);
      if (ackPending === 0 && notDelivered === 0) return true;
      await sleep(100);
    }
    return false;
  }

  async delete(): Promise<void> {
    await this.manager.streams.delete(this.stream).catch(() => undefined);
    await this.manager.streams.delete(`${this.stream}_DEAD`).catch(() => undefined);
    await this.connection.close().catch(() => undefined);
  }
}

/** Polls `check` until it holds; false if it did not within `timeoutMs`. */
export async function waitFor(check: () => Promise<boolean> | boolean, timeoutMs = 20_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await sleep(50);
  }
  return false;
}
