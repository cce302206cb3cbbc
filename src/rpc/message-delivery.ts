/**
 * One delivered message as the idempotent consumer sees it, whatever the
 * broker: where its id is, how often it was delivered, and how to settle it.
 * Read off the transport's RPC context by shape, so the core never loads a
 * broker's package (they are optional peers).
 */
export interface MessageDelivery {
  /** The transport, for messages and docs: `'rabbitmq'`, `'jetstream'`, `'nats'`, or `'other'` (no acknowledgement). */
  readonly transport: 'rabbitmq' | 'jetstream' | 'nats' | 'other';
  /** The pattern or subject it arrived on; part of its fingerprint. */
  readonly pattern: string | undefined;
  /** The broker's own message id (RabbitMQ `messageId`, the `Nats-Msg-Id` header), if any. */
  readonly messageId: string | undefined;
  /** How many times the broker delivered it, this one included, where the broker says. */
  readonly deliveryCount: number | undefined;
  /** Whether it waits for an acknowledgement: only then can it be requeued or dead-lettered. */
  readonly settles: boolean;
  /** Done with it: the broker forgets it. */
  ack(): void;
  /** Give it back to be delivered again after `delayMs` (0: at once). */
  retry(delayMs: number): void;
  /** Never deliver it again here: the broker's dead-letter route takes it. */
  deadLetter(reason: string): void;
}

/** Header NATS JetStream deduplicates publishes by; the default key of a NATS message. */
export const NATS_MSG_ID_HEADER = 'Nats-Msg-Id';

interface AmqpMessage {
  fields?: { redelivered?: boolean };
  properties?: { messageId?: unknown; headers?: Record<string, unknown> };
}
interface AmqpChannel {
  ack(message: unknown): void;
  nack(message: unknown, allUpTo?: boolean, requeue?: boolean): void;
}
interface NatsHeaders {
  get(name: string): string;
}

/** What a settle call does when the channel it needs is gone: the broker redelivers on its own then. */
export type SettleFailure = (action: 'ack' | 'requeue' | 'dead-letter', error: unknown) => void;

/**
 * The delivery behind an RPC context: RabbitMQ's `RmqContext`, this
 * package's `JetStreamContext` (nest-idempotency-pg/jetstream), Nest's core
 * `NatsContext`, or anything else (TCP, Redis, MQTT: nothing to settle).
 */
export function messageDelivery(rpcContext: unknown, onSettleFailure: SettleFailure): MessageDelivery {
  return settledOnce(deliveryOf(rpcContext, onSettleFailure));
}

/**
 * A message is settled once: a second acknowledgement of the same AMQP
 * delivery tag is a channel error that closes the channel, and with it every
 * other message in flight on it.
 */
function settledOnce(delivery: MessageDelivery): MessageDelivery {
  let settled = false;
  const once =
    <A extends unknown[]>(fn: (...args: A) => void) =>
    (...args: A) => {
      if (settled) return;
      settled = true;
      fn(...args);
    };
  return { ...delivery, ack: once(delivery.ack), retry: once(delivery.retry), deadLetter: once(delivery.deadLetter) };
}

function deliveryOf(rpcContext: unknown, onSettleFailure: SettleFailure): MessageDelivery {
  const ctx = rpcContext as Record<string, unknown> | null | undefined;
  if (ctx && typeof ctx.getChannelRef === 'function' && typeof ctx.getMessage === 'function') {
    return rabbitMqDelivery(ctx, onSettleFailure);
  }
  if (ctx && typeof ctx.getJetStreamMessage === 'function') return jetStreamDelivery(ctx, onSettleFailure);
  if (ctx && typeof ctx.getSubject === 'function' && typeof ctx.getHeaders === 'function') {
    const headers = (ctx.getHeaders as () => NatsHeaders | undefined)();
    return unsettled('nats', (ctx.getSubject as () => string)(), nonEmpty(safeHeader(headers, NATS_MSG_ID_HEADER)));
  }
  const pattern = ctx && typeof ctx.getPattern === 'function' ? String((ctx.getPattern as () => unknown)()) : undefined;
  return unsettled('other', pattern, undefined);
}

function rabbitMqDelivery(ctx: Record<string, unknown>, onSettleFailure: SettleFailure): MessageDelivery {
  const message = (ctx.getMessage as () => AmqpMessage)();
  const channel = (ctx.getChannelRef as () => AmqpChannel)();
  const headers = message.properties?.headers ?? {};
  // Quorum queues count earlier deliveries in x-delivery-count; classic queues only say "redelivered".
  const counted = headers['x-delivery-count'];
  const deliveryCount = typeof counted === 'number' ? counted + 1 : message.fields?.redelivered === false ? 1 : undefined;
  const settle = (action: 'ack' | 'requeue' | 'dead-letter', fn: () => void) => {
    try {
      fn();
    } catch (error) {
      onSettleFailure(action, error);
    }
  };
  return {
    transport: 'rabbitmq',
    pattern: typeof ctx.getPattern === 'function' ? String((ctx.getPattern as () => unknown)()) : undefined,
    messageId: nonEmpty(message.properties?.messageId),
    deliveryCount,
    settles: true,
    ack: () => settle('ack', () => channel.ack(message)),
    // RabbitMQ has no delayed requeue: the message stays unacknowledged (its prefetch slot taken) until then.
    retry: (delayMs) =>
      void setTimeout(() => settle('requeue', () => channel.nack(message, false, true)), Math.max(0, delayMs)).unref?.(),
    // Rejected without requeue: the queue's dead-letter exchange takes it (without one, RabbitMQ drops it).
    deadLetter: () => settle('dead-letter', () => channel.nack(message, false, false)),
  };
}

interface JetStreamSettling {
  getSubject(): string;
  getJetStreamMessage(): { headers?: NatsHeaders; info?: { deliveryCount?: number } };
  ack(): void;
  retry(delayMs: number): void;
  deadLetter(reason: string): void | Promise<void>;
}

function jetStreamDelivery(ctx: Record<string, unknown>, onSettleFailure: SettleFailure): MessageDelivery {
  const js = ctx as unknown as JetStreamSettling;
  const message = js.getJetStreamMessage();
  const settle = (action: 'ack' | 'requeue' | 'dead-letter', fn: () => void | Promise<void>) => {
    try {
      const pending = fn();
      if (pending instanceof Promise) pending.catch((error: unknown) => onSettleFailure(action, error));
    } catch (error) {
      onSettleFailure(action, error);
    }
  };
  return {
    transport: 'jetstream',
    pattern: js.getSubject(),
    messageId: nonEmpty(safeHeader(message.headers, NATS_MSG_ID_HEADER)),
    deliveryCount: message.info?.deliveryCount,
    settles: true,
    ack: () => settle('ack', () => js.ack()),
    // JetStream redelivers after the delay itself (a nak with a delay): nothing is held here meanwhile.
    retry: (delayMs) => settle('requeue', () => js.retry(delayMs)),
    deadLetter: (reason) => settle('dead-letter', () => js.deadLetter(reason)),
  };
}

/** A transport without acknowledgements (core NATS, TCP, Redis): at most once already, nothing to settle. */
function unsettled(transport: 'nats' | 'other', pattern: string | undefined, messageId: string | undefined): MessageDelivery {
  return {
    transport,
    pattern,
    messageId,
    deliveryCount: undefined,
    settles: false,
    ack: () => undefined,
    retry: () => undefined,
    deadLetter: () => undefined,
  };
}

function safeHeader(headers: NatsHeaders | undefined, name: string): string | undefined {
  try {
    return headers?.get(name) || undefined;
  } catch {
    return undefined;
  }
}

function nonEmpty(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}
