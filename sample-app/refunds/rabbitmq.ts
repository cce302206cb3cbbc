import { Transport, type RmqOptions } from '@nestjs/microservices';
import amqp from 'amqplib';

/** The dead-letter queue of `queue`, where a refund request goes that can never be processed. */
export const deadLetterQueue = (queue: string) => `${queue}.dead`;

/**
 * The consumer's transport: manual acknowledgements (`noAck: false`), so the
 * idempotency module acknowledges each message after its commit, and a
 * dead-letter route for the messages it rejects.
 */
export function refundConsumerOptions(url: string, queue: string): RmqOptions {
  return {
    transport: Transport.RMQ,
    options: {
      urls: [url],
      queue,
      noAck: false,
      prefetchCount: 50,
      queueOptions: {
        durable: true,
        arguments: { 'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': deadLetterQueue(queue) },
      },
    },
  };
}

/** Declares the dead-letter queue (Nest declares the work queue itself): without it RabbitMQ drops what it is sent. */
export async function declareDeadLetterQueue(url: string, queue: string): Promise<void> {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createChannel();
    await channel.assertQueue(deadLetterQueue(queue), { durable: true });
  } finally {
    await connection.close();
  }
}
