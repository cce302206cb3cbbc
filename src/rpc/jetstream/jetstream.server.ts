import { Server, type CustomTransportStrategy } from '@nestjs/microservices';
import type { ConsumerConfig, ConsumerMessages, JetStreamClient, JsMsg } from '@nats-io/jetstream';
import type { NatsConnection, NodeConnectionOptions } from '@nats-io/transport-node';
import { JetStreamContext } from './jetstream.context.js';

export interface JetStreamServerOptions {
  /** NATS servers. Default `'127.0.0.1:4222'`. */
  servers?: string | string[];
  /** Further options for `connect()` of @nats-io/transport-node (credentials, TLS, name). */
  connection?: Omit<NodeConnectionOptions, 'servers'>;
  /**
   * The stream to consume. With `subjects` it is created, or its subjects
   * updated, at start-up; without, it must exist.
   */
  stream: { name: string; subjects?: string[] };
  /**
   * The durable pull consumer, created with explicit acks when missing.
   * `config` is used when creating it (e.g. `ack_wait`, `max_deliver`,
   * `filter_subjects`); an existing consumer is used as it is.
   */
  consumer: { name: string; config?: Partial<ConsumerConfig> };
  /** Messages pulled and handled at once. Default 64. */
  maxMessages?: number;
  /**
   * Where a dead-lettered message is republished (headers kept, plus
   * `Nats-Dead-Letter-Reason` and `Nats-Dead-Letter-Subject`), for an operator
   * to inspect and replay; a stream must capture that subject. Default
   * `` `dead-letter.${subject}` ``.
   */
  deadLetterSubject?: (subject: string) => string;
}

const DEFAULT_SERVERS = '127.0.0.1:4222';
const DEFAULT_MAX_MESSAGES = 64;
/** A message whose dead-letter copy could not be published is tried again after this, never dropped. */
const DEAD_LETTER_RETRY_MS = 5_000;

/**
 * A Nest microservice transport that consumes a NATS JetStream stream with
 * explicit acknowledgements, so `@EventPattern(subject)` handlers get
 * at-least-once delivery: Nest's own NATS transport is core NATS (at most
 * once, nothing to redeliver). A message's subject is its pattern and its
 * JSON body its payload. With `@Idempotent()` the handler runs once per key
 * (the `Nats-Msg-Id` header by default) and the module settles the message;
 * without, it is acknowledged when the handler completes and redelivered
 * when it fails.
 *
 * ```ts
 * app.connectMicroservice({ strategy: new JetStreamServer({ stream: { name: 'REFUNDS', subjects: ['refunds.>'] }, consumer: { name: 'refunds-worker' } }) });
 * ```
 */
export class JetStreamServer extends Server implements CustomTransportStrategy {
  private connection?: NatsConnection;
  private client?: JetStreamClient;
  private messages?: ConsumerMessages;
  private ackWaitMs = 30_000;
  private readonly inFlight = new Set<Promise<void>>();

  constructor(private readonly options: JetStreamServerOptions) {
    super();
  }

  async listen(callback: (error?: unknown) => void): Promise<void> {
    try {
      await this.start();
      callback();
    } catch (error) {
      callback(error);
    }
  }

  private async start(): Promise<void> {
    // Loaded here, not at the top: the package is an optional peer, only needed by apps that use this transport.
    const { connect } = await import('@nats-io/transport-node');
    const { AckPolicy, jetstream, jetstreamManager } = await import('@nats-io/jetstream');
    this.connection = await connect({ ...this.options.connection, servers: this.options.servers ?? DEFAULT_SERVERS });
    const manager = await jetstreamManager(this.connection);
    const { stream, consumer } = this.options;
    if (stream.subjects) {
      const existing = await manager.streams.info(stream.name).catch(() => undefined);
      if (existing) await manager.streams.update(stream.name, { subjects: stream.subjects });
      else await manager.streams.add({ name: stream.name, subjects: stream.subjects });
    }
    const info = await manager.consumers
      .info(stream.name, consumer.name)
      .catch(async () =>
        manager.consumers.add(stream.name, { ack_policy: AckPolicy.Explicit, ...consumer.config, durable_name: consumer.name }),
      );
    this.ackWaitMs = Math.max(1_000, Math.floor(Number(info.config.ack_wait ?? 30_000_000_000) / 1_000_000));
    this.client = jetstream(this.connection);
    const pull = await this.client.consumers.get(stream.name, consumer.name);
    this.messages = await pull.consume({ max_messages: this.options.maxMessages ?? DEFAULT_MAX_MESSAGES });
    void this.pump(this.messages);
  }

  private async pump(messages: ConsumerMessages): Promise<void> {
    try {
      for await (const message of messages) {
        const handled = this.dispatch(message).catch((error: unknown) => this.logger.error(error));
        this.inFlight.add(handled);
        void handled.finally(() => this.inFlight.delete(handled));
      }
    } catch (error) {
      this.logger.error(error);
    }
  }

  private async dispatch(message: JsMsg): Promise<void> {
    // Tells JetStream the message is still being worked on, so a handler slower than ack_wait is not delivered twice meanwhile.
    const progress = setInterval(() => message.working(), Math.max(500, Math.floor(this.ackWaitMs / 2)));
    progress.unref();
    const context = new JetStreamContext([message, message.subject], {
      ack: () => {
        clearInterval(progress);
        message.ack();
      },
      retry: (delayMs) => {
        clearInterval(progress);
        message.nak(delayMs);
      },
      deadLetter: async (reason) => {
        clearInterval(progress);
        await this.deadLetter(message, reason);
      },
    });
    const handler = this.getHandlerByPattern(message.subject);
    if (!handler) {
      this.logger.warn(`JetStreamServer: no handler for subject ${message.subject}; the message is dead-lettered.`);
      return context.deadLetter('no handler for its subject');
    }
    let data: unknown;
    try {
      data = message.json();
    } catch {
      data = message.string();
    }
    await this.runWithProcessingHooks(context, async (runEndHook) => {
      const result$ = this.transformToObservable(await handler(data, context));
      await new Promise<void>((resolve) => {
        result$.subscribe({
          error: (error: unknown) => {
            runEndHook();
            if (!context.settled) context.retry(0);
            // Nest's exception layer has logged the handler's error; the message goes back to JetStream.
            void error;
            resolve();
          },
          complete: () => {
            runEndHook();
            if (!context.settled) context.ack();
            resolve();
          },
        });
      });
    });
  }

  private async deadLetter(message: JsMsg, reason: string): Promise<void> {
    const { headers } = await import('@nats-io/transport-node');
    const copy = headers();
    for (const [name, values] of message.headers ?? []) for (const value of values) copy.append(name, value);
    copy.set('Nats-Dead-Letter-Reason', reason);
    copy.set('Nats-Dead-Letter-Subject', message.subject);
    const subject = (this.options.deadLetterSubject ?? ((s: string) => `dead-letter.${s}`))(message.subject);
    try {
      // Nats-Msg-Id stays: the copy lives in another stream (deduplication is per stream), and a replay needs its key.
      await this.client!.publish(subject, message.data, { headers: copy });
      // No reason: servers before 2.11 do not understand one, and would take the term for no answer at all.
      message.term();
    } catch (error) {
      this.logger.error(
        `JetStreamServer: dead-lettering a message to ${subject} failed (${error instanceof Error ? error.message : String(error)}); ` +
          'it is delivered again instead. Make a stream capture the dead-letter subject.',
      );
      message.nak(DEAD_LETTER_RETRY_MS);
    }
  }

  async close(): Promise<void> {
    await this.messages?.close();
    await Promise.allSettled([...this.inFlight]);
    await this.connection?.drain().catch(() => undefined);
  }

  on(): void {
    throw new Error('JetStreamServer does not emit events; use its status or the NATS connection (unwrap()).');
  }

  unwrap<T>(): T {
    if (!this.connection) throw new Error('JetStreamServer is not listening yet.');
    return this.connection as T;
  }
}
