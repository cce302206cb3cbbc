import { JetStreamServer } from '../../src/rpc/jetstream/index.js';
import { REFUND_REQUESTED } from './refund-request.message.js';

/** The durable pull consumer of refund requests on the stream. */
export const REFUND_CONSUMER = 'refund-requests';
/** The stream that keeps the dead letters of `stream`, for an operator to inspect and replay. */
export const deadLetterStream = (stream: string) => `${stream}_DEAD`;
/** Where the consumer republishes a refund request that can never be processed. */
export const deadLetterSubject = (subject: string) => `dead-letter.${subject}`;

export interface RefundStreamConfig {
  natsUrl: string;
  /** The stream, created (or its subjects set) at start-up. */
  refundStream: string;
  /** The subject refund requests are published on, the stream's only one. */
  refundSubject: string;
}

/**
 * The library's JetStream transport (`nest-idempotency-pg/jetstream`) for
 * refund requests: a durable pull consumer with explicit acknowledgements,
 * so the idempotency module acknowledges each message after its commit, and
 * a dead-letter subject another stream keeps. The subject is configurable,
 * the handler's pattern is not: `pattern` maps one to the other.
 */
export function refundJetStreamServer(config: RefundStreamConfig): JetStreamServer {
  return new JetStreamServer({
    servers: config.natsUrl,
    stream: { name: config.refundStream, subjects: [config.refundSubject] },
    // ack_wait: how long an unacknowledged delivery (its consumer died) waits before JetStream delivers it again.
    consumer: { name: REFUND_CONSUMER, config: { ack_wait: 30_000_000_000 } },
    deadLetterSubject,
    pattern: (subject) => (subject === config.refundSubject ? REFUND_REQUESTED : subject),
    // At most this many refunds at once, each holding a connection of the pool (20) for its transaction.
    maxMessages: 10,
  });
}

/**
 * Creates the dead-letter stream unless it exists (the transport creates the
 * work stream itself): without a stream capturing the dead-letter subject,
 * JetStream refuses the copy and the message is delivered again instead.
 */
export async function declareDeadLetterStream(config: RefundStreamConfig): Promise<void> {
  // Loaded only when NATS_URL is set, as the library's transport loads them.
  const { connect } = await import('@nats-io/transport-node');
  const { jetstreamManager } = await import('@nats-io/jetstream');
  const connection = await connect({ servers: config.natsUrl });
  try {
    const manager = await jetstreamManager(connection);
    const name = deadLetterStream(config.refundStream);
    const existing = await manager.streams.info(name).catch(() => undefined);
    if (!existing) await manager.streams.add({ name, subjects: [deadLetterSubject(config.refundSubject)] });
  } finally {
    await connection.close();
  }
}
