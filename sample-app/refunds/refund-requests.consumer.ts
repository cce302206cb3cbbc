import { Controller } from '@nestjs/common';
import { Ctx, EventPattern, Payload, RmqContext, RpcException } from '@nestjs/microservices';
import { setTimeout as sleep } from 'node:timers/promises';
import { Idempotent } from '../../src/index.js';
import { JetStreamContext } from '../../src/rpc/jetstream/index.js';
import { FAULT_INJECTION_ENV } from '../faults/fault-injection.interceptor.js';
import { REFUND_REQUESTED, RefundRequestMessage, type CrashPoint } from './refund-request.message.js';
import { RefundRefused, RefundsService, type Refund } from './refunds.service.js';

/** Deliveries whose acknowledgement kills the process (`simulate.crash: 'after-commit'`). */
const doomedAcks = new WeakSet<object>();

/**
 * Consumes refund requests from RabbitMQ (when `RABBITMQ_URL` is set) and
 * from NATS JetStream (when `NATS_URL` is set): the same handler for both.
 * `@Idempotent()` takes the key from the message's AMQP `messageId` or its
 * `Nats-Msg-Id` header, runs the refund in the transaction its completion
 * commits in, and acknowledges the message only after that commit; the
 * effect ledger refuses a refund whose request comes back after its key
 * expired.
 */
@Controller()
export class RefundRequestsConsumer {
  constructor(private readonly refunds: RefundsService) {}

  @EventPattern(REFUND_REQUESTED)
  @Idempotent()
  // Nest 12 types an event handler's arguments after the payload as unknown.
  async requested(@Payload() message: RefundRequestMessage, @Ctx() context: unknown): Promise<Refund> {
    let refund: Refund;
    try {
      refund = await this.refunds.refund(message.tenant, message, 'message');
    } catch (error) {
      // A definite refusal: stored with the key and acknowledged, never retried.
      if (error instanceof RefundRefused) throw new RpcException({ status: 'error', code: error.code, message: error.message });
      throw error;
    }
    if (message.simulate?.delayMs) await sleep(message.simulate.delayMs);
    if (message.simulate?.fail) throw new Error('The refund processor is unavailable.');
    if (message.simulate?.crash) crash(message.simulate.crash, context);
    return refund;
  }
}

/**
 * Test-only (SAMPLE_FAULT_INJECTION=1). `every-delivery` kills the process
 * now, on every delivery, with the refund inserted and uncommitted. On the
 * first delivery only, `before-commit` does the same, and `after-commit`
 * kills it when the module acknowledges this message, which it does only
 * after the commit.
 */
function crash(where: CrashPoint, context: unknown): void {
  if (process.env[FAULT_INJECTION_ENV] !== '1') return;
  if (where === 'every-delivery') process.kill(process.pid, 'SIGKILL');
  if (context instanceof JetStreamContext) {
    if (context.getJetStreamMessage().redelivered) return;
    if (where === 'before-commit') process.kill(process.pid, 'SIGKILL');
    // The module acknowledges through the context, once per message.
    context.ack = () => process.kill(process.pid, 'SIGKILL');
    return;
  }
  if (!(context instanceof RmqContext)) return;
  const message = context.getMessage() as { fields: { redelivered: boolean } };
  if (message.fields.redelivered) return;
  if (where === 'before-commit') process.kill(process.pid, 'SIGKILL');
  // The module acknowledges through the channel, which all the consumer's messages share.
  const channel = context.getChannelRef() as { ack(message: object, ...rest: unknown[]): void; __doomed?: true };
  doomedAcks.add(message);
  if (channel.__doomed) return;
  const ack = channel.ack.bind(channel);
  channel.ack = (acked: object, ...rest: unknown[]) => {
    if (doomedAcks.has(acked)) process.kill(process.pid, 'SIGKILL');
    ack(acked, ...rest);
  };
  channel.__doomed = true;
}
