import { Controller } from '@nestjs/common';
import { Ctx, EventPattern, Payload, RpcException, type RmqContext } from '@nestjs/microservices';
import { setTimeout as sleep } from 'node:timers/promises';
import { Idempotent } from '../../src/index.js';
import { FAULT_INJECTION_ENV } from '../faults/fault-injection.interceptor.js';
import { REFUND_REQUESTED, RefundRequestMessage, type CrashPoint } from './refund-request.message.js';
import { RefundRefused, RefundsService, type Refund } from './refunds.service.js';

/** Deliveries whose acknowledgement kills the process (`simulate.crash: 'after-commit'`). */
const doomedAcks = new WeakSet<object>();

/**
 * Consumes refund requests from RabbitMQ (started only when `RABBITMQ_URL` is
 * set). `@Idempotent()` takes the key from the message's `messageId`, runs
 * the refund in the transaction its completion commits in, and acknowledges
 * the message only after that commit; the effect ledger refuses a refund
 * whose request comes back after its key expired.
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
    if (message.simulate?.crash) crash(message.simulate.crash, context as RmqContext);
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
function crash(where: CrashPoint, context: RmqContext): void {
  if (process.env[FAULT_INJECTION_ENV] !== '1') return;
  if (where === 'every-delivery') process.kill(process.pid, 'SIGKILL');
  const message = context.getMessage() as { fields: { redelivered: boolean } };
  if (message.fields.redelivered) return;
  if (where === 'before-commit') process.kill(process.pid, 'SIGKILL');
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
