import { Server, type CustomTransportStrategy } from '@nestjs/microservices';
import type { Consumer, ConsumerConfig, ConsumerMessages, JetStreamClient, JsMsg } from '@nats-io/jetstream';
import type { NatsConnection, NodeConnectionOptions } from '@nats-io/transport-node';
import { setTimeout as sleep } from 'node:timers/promises';
import { jetStreamMessages } from './messages.js';
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
  /**
   * Handlers running at once: the server pulls a message only when one of
   * these slots is free, so a backlog waits on the JetStream server (its
   * `ack_wait` not started) rather than in this process. Keep it at or below
   * the data source's pool size: each running `@Idempotent()` handler holds a
   * connection for its transaction. Default 10 (pg's default pool size).
   */
  maxMessages?: number;
  /**
   * Where a dead-lettered message is republished (headers kept, plus
   * `Nats-Dead-Letter-Reason` and `Nats-Dead-Letter-Subject`), for an operator
   * to inspect and replay; a stream must capture that subject. Default
   * `` `dead-letter.${subject}` ``.
   */
  deadLetterSubject?: (subject: string) => string;
  /**
   * The handler pattern a message is dispatched to, from its subject: for
   * subjects named per deployment (`staging.refund.requested`, from
   * configuration) whose handlers are declared with a constant
   * (`@EventPattern('refund.requested')`). The subject stays the message's
   * pattern for the idempotency fingerprint. Default: the subject itself.
   */
  pattern?: (subject: string) => string;
}

const DEFAULT_SERVERS = '127.0.0.1:4222';
const DEFAULT_MAX_MESSAGES = 10;
/** After a failed pull (NATS unreachable, the consumer deleted) the next waits this long, doubling up to PULL_RETRY_MAX_MS. */
const PULL_RETRY_MS = 1_000;
const PULL_RETRY_MAX_MS = 30_000;
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
  private ackWaitMs = 30_000;
  private readonly maxMessages: number;
  private readonly inFlight = new Set<Promise<void>>();
  /** Wakes the pull loop waiting for a free slot. */
  private slotFreed?: () => void;
  /** The pull request being served, closed by close() so the loop stops waiting on it. */
  private batch?: ConsumerMessages;
  private pulling?: Promise<void>;
  private closing = false;
  private readonly closed: Promise<void>;
  private markClosed!: () => void;

  constructor(private readonly options: JetStreamServerOptions) {
    super();
    this.maxMessages = options.maxMessages ?? DEFAULT_MAX_MESSAGES;
    if (!Number.isSafeInteger(this.maxMessages) || this.maxMessages < 1) {
      throw new Error(jetStreamMessages.maxMessages(options.maxMessages));
    }
    this.closed = new Promise((resolve) => (this.markClosed = resolve));
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
    this.pulling = this.pull(await this.client.consumers.get(stream.name, consumer.name));
  }

  /**
   * Pulls as many messages as there are free slots, never more, and starts a
   * handler for each as it arrives. Not `consume()`: it pulls ahead as
   * messages arrive, not as they are handled, so a backlog would pile up
   * here, each message's ack_wait running, and every handler of it would
   * start at once (the bound would be the consumer's `max_ack_pending`). A
   * pull ends when it is filled or expires; meanwhile the slots it does not
   * fill stay free for it, so waiting for it loses no capacity.
   */
  private async pull(consumer: Consumer): Promise<void> {
    for (let failures = 0; !this.closing;) {
      while (this.inFlight.size >= this.maxMessages && !this.closing) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
      }
      if (this.closing) return;
      try {
        const batch = await consumer.fetch({ max_messages: this.maxMessages - this.inFlight.size });
        if (this.closing) {
          await batch.close();
          return;
        }
        this.batch = batch;
        for await (const message of batch) this.track(this.dispatch(message));
        failures = 0;
      } catch (error) {
        if (this.closing) return;
        const retryMs = Math.min(PULL_RETRY_MAX_MS, PULL_RETRY_MS * 2 ** failures++);
        const { stream, consumer: name } = this.options;
        this.logger.error(
          jetStreamMessages.pullFailed(stream.name, name.name, error instanceof Error ? error.message : String(error), retryMs),
        );
        await Promise.race([sleep(retryMs, undefined, { ref: false }), this.closed]);
      } finally {
        this.batch = undefined;
      }
    }
  }

  private track(dispatch: Promise<void>): void {
    const handled = dispatch.catch((error: unknown) => this.logger.error(error));
    this.inFlight.add(handled);
    void handled.finally(() => {
      this.inFlight.delete(handled);
      this.slotFreed?.();
      this.slotFreed = undefined;
    });
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
    const handler = this.getHandlerByPattern(this.options.pattern?.(message.subject) ?? message.subject);
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

  /** Stops pulling, waits for the handlers running, then drains the connection. */
  async close(): Promise<void> {
    this.closing = true;
    this.markClosed();
    this.slotFreed?.();
    await this.batch?.close();
    await this.pulling;
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
