import { HttpException } from '@nestjs/common';
import { fingerprintValue } from '../core/fingerprint-value.js';
import type { ClaimInfo } from '../core/work.js';
import { checkKey } from '../core/key.js';
import type { FailurePolicy, FailureReading } from '../core/outcomes.js';
import type { EngineOutcome } from '../core/work.js';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';
import { messageDelivery, type MessageDelivery } from '../rpc/message-delivery.js';
import { lastValueOf } from './http-transport.js';
import { OnceSubscriber } from './once-subscriber.js';
import { messageAnswerFor, messageRefusal } from './outcome-answers.js';
import { NestTransport } from './nest-transport.js';
import type { Done } from './transport.js';
import { jsonResponse, readJson, type StoredOutcome } from './stored-outcome.js';
import { withoutIdempotency } from './without-idempotency.js';

/** Set by `@EventPattern` (2) and `@MessagePattern` (1) on the handler (@nestjs/microservices' PatternHandler). */
const HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER = 2;
/** The payload field read for the key when the broker gives no message id. */
const DEFAULT_KEY_FIELD = 'idempotencyKey';

/** A delivery whose message was already attempted `maxDeliveries` times: dead-lettered before the handler runs again. */
class PoisonMessageError extends Error {
  constructor(readonly attempts: number) {
    super(`The message was already attempted ${attempts} times.`);
  }
}

/** A message's reply, which may also end with no answer, or pass on the values of a handler run without a key. */
class MessageReply extends OnceSubscriber {
  /** Ends with no value: completes the Observable, or (`complete` false) leaves it open and answers nothing. */
  end(complete = true): void {
    if (this.settle() && complete) this.subscriber.complete();
  }

  /** A value of a handler run without a key, passed on as it comes. */
  pass(value: unknown): void {
    if (!this.done) this.subscriber.next(value);
  }
}

type Microservices = typeof import('@nestjs/microservices');
let microservices: Promise<Microservices> | undefined;
/** Loaded on the first message only: a message context exists only where the package is installed. */
const loadMicroservices = () => (microservices ??= import('@nestjs/microservices'));

/**
 * An `@EventPattern` or `@MessagePattern` handler: the key from the message,
 * and the message settled with the broker only once its outcome is
 * committed. A redelivery of a completed message is acknowledged without
 * running (a `MessagePattern` gets the stored reply); a duplicate that finds
 * the key in flight is requeued after its Retry-After; a message that can
 * never be processed (no key, another message's key, a handler that failed
 * `maxDeliveries` times) is dead-lettered.
 */
export class MessageTransport extends NestTransport {
  readonly delivery: MessageDelivery = messageDelivery(this.context.switchToRpc().getContext(), (action, error) =>
    this.runtime.logger.error(
      messages.consumer.settleFailed(this.route.name, action, error instanceof Error ? error.message : String(error)),
    ),
  );
  private readonly reply = new MessageReply(this.subscriber);
  private readonly expectsReply = Reflect.getMetadata(HANDLER_TYPE_METADATA, this.context.getHandler()) !== EVENT_HANDLER;
  /** The claim's attempt number, once claimed; the policy that decided a failure; when the handler started. */
  private attempt = 1;
  private policy: FailurePolicy | 'rejected' = 'keep';
  private startedAt = Date.now();

  readKey(): string | undefined {
    const option = this.route.options.key;
    const data = this.context.switchToRpc().getData<unknown>();
    const key =
      typeof option === 'function'
        ? nonEmpty(option(this.context))
        : typeof option === 'string'
          ? nonEmpty(field(data, option))
          : (this.delivery.messageId ?? nonEmpty(field(data, DEFAULT_KEY_FIELD)));
    if (key === undefined) return undefined;
    const checked = checkKey(key, this.runtime.options.maxKeyLength);
    if (!checked.ok) throw problems.invalidKey(checked.reason, checked.detail);
    return key;
  }

  fingerprint(): string {
    const data = this.context.switchToRpc().getData<unknown>() ?? null;
    return fingerprintValue({ pattern: this.delivery.pattern ?? this.route.name, data });
  }

  async invoke(claim: ClaimInfo): Promise<Done<unknown>> {
    const { claimMode, maxDeliveries } = this.route.options;
    this.attempt = claim.attempt;
    // Attempts that never reached a verdict (the process crashed, was killed or ran out of memory) count too: the key
    // row counts them; a claim that rolls back with its work (request-transaction) keeps no count, so there the
    // broker's (which also counts requeues of a duplicate that found the key in flight) decides.
    const brokerCount = claimMode === 'request-transaction' ? (this.delivery.deliveryCount ?? 1) : 1;
    const attempted = Math.max(claim.attempt, brokerCount) - 1;
    if (attempted >= maxDeliveries) throw new PoisonMessageError(attempted);
    this.startedAt = Date.now();
    const value = await lastValueOf(this.next.handle());
    return { response: jsonResponse({ value: value ?? null }, 200), result: value };
  }

  async readFailure(error: unknown): Promise<FailureReading> {
    // A poison message is dead-lettered; its key goes, so a redrive after a fix starts with a fresh count.
    if (error instanceof PoisonMessageError) return { action: 'release', forget: true };
    const definite = await isDefinite(error);
    return { definite, response: async () => jsonResponse({ error: await rpcPayload(error) }, 400) };
  }

  decided(policy: FailurePolicy | 'rejected'): void {
    this.policy = policy;
  }

  runWithoutKey(): void {
    const { delivery, reply } = this;
    withoutIdempotency(this.runtime, () =>
      this.next.handle().subscribe({
        next: (value) => reply.pass(value),
        error: (error: unknown) => {
          // Without a key nothing counts its attempts: the broker's dead-letter route decides what comes next.
          this.runtime.logger.warn(messages.consumer.deadLettered(this.route.name, messages.consumer.failedWithoutKey));
          delivery.deadLetter(messages.consumer.failedWithoutKey);
          reply.fail(error);
        },
        complete: () => {
          delivery.ack();
          reply.end();
        },
      }),
    );
  }

  async answer(outcome: EngineOutcome<unknown>): Promise<void> {
    // Committed (or found committed): only now may the broker forget the message.
    this.delivery.ack();
    const stored = readJson<StoredOutcome>(outcome.response, { value: null });
    if ('error' in stored) return this.reply.fail(await rpcError(stored.error));
    this.reply.emit(stored.value);
  }

  async refuse(error: unknown, step: 'key' | 'tenant' | 'fingerprint'): Promise<void> {
    const reason = messageRefusal(error, step, this.runtime.options.maxKeyLength);
    // A bug (a custom key or fingerprint function that threw): kept for a person to look at, never retried in a loop.
    if (reason === undefined) return this.unexpected(error);
    const thrownByKeyFunction = step === 'key' && !(error instanceof HttpException);
    await this.deadLetter(reason, thrownByKeyFunction ? error : undefined);
  }

  async fail(error: unknown): Promise<void> {
    const answer = messageAnswerFor(error, this.runtime.options.unavailableRetryAfter);
    if (answer && 'requeue' in answer) return this.requeue(answer.requeue.delayMs, answer.requeue.why, answer.requeue.type);
    if (answer) return this.deadLetter(answer.deadLetter);
    if (error instanceof PoisonMessageError) return this.deadLetter(messages.consumer.poisoned(error.attempts));
    if (this.policy === 'rejected') return this.deadLetter(messages.consumer.rejected, error);
    return this.afterHandlerFailure(error, this.policy);
  }

  /** Anything else that went wrong: dead-lettered and logged, for a person to look at. */
  unexpected(error: unknown): void {
    this.runtime.logger.error(
      messages.consumer.unexpected(this.route.name),
      error instanceof Error ? error.stack : String(error),
    );
    this.delivery.deadLetter(messages.consumer.unexpected(this.route.name));
    this.reply.fail(error);
  }

  /**
   * The handler failed and its key was kept (or released): deliver the
   * message again, once the lease lets a redelivery take the key over, or
   * dead-letter it once it has failed `maxDeliveries` times. The count is
   * the key's attempts (one more per takeover), or the broker's own count
   * where it keeps one; a released key keeps no count, so without the
   * broker's the message is dead-lettered at once rather than loop.
   */
  private async afterHandlerFailure(error: unknown, policy: FailurePolicy): Promise<void> {
    const { maxDeliveries: max, claimMode, leaseMs } = this.route.options;
    // A released key, or a claim that rolled back with the work (request-transaction), keeps no count of its attempts.
    const uncounted = policy === 'release' || claimMode === 'request-transaction';
    const counted = this.delivery.deliveryCount ?? (uncounted ? max : 0);
    const deliveries = Math.max(this.attempt, counted);
    if (!this.delivery.settles) return this.reply.fail(error);
    if (deliveries >= max) return this.deadLetter(messages.consumer.failed(deliveries), error);
    const delayMs = policy === 'keep' ? Math.max(1_000, this.startedAt + leaseMs - Date.now()) : 0;
    this.runtime.logger.warn(messages.consumer.handlerFailed(this.route.name, deliveries, max, Math.ceil(delayMs / 1000)));
    this.delivery.retry(delayMs);
    // An event's error goes on to Nest, which logs it; a requester waits for the redelivery's answer.
    if (this.expectsReply) this.reply.end(false);
    else this.reply.fail(error);
  }

  private async deadLetter(reason: string, cause?: unknown): Promise<void> {
    this.runtime.logger.warn(messages.consumer.deadLettered(this.route.name, reason));
    this.delivery.deadLetter(reason);
    this.reply.fail(cause ?? (await rpcError(reason)));
  }

  private async requeue(delayMs: number, why: string, type: string): Promise<void> {
    const retryAfter = Math.max(1, Math.ceil(delayMs / 1000));
    if (!this.delivery.settles) {
      // Nothing to requeue on this transport (TCP, core NATS): the sender learns it must retry, as an HTTP 409 says.
      return this.reply.fail(await rpcError({ status: 'error', type, message: why, retryAfter }));
    }
    this.runtime.logger.log(messages.consumer.requeued(this.route.name, retryAfter, why));
    this.delivery.retry(delayMs);
    // No answer now: the redelivery answers a MessagePattern's requester, with the stored reply.
    this.reply.end(!this.expectsReply);
  }
}

/** A definite outcome, stored by the `onHttpException` policy: an `RpcException`, or an `HttpException` below 500. */
async function isDefinite(error: unknown): Promise<boolean> {
  if (error instanceof HttpException) return error.getStatus() < 500;
  const { RpcException } = await loadMicroservices();
  return error instanceof RpcException;
}

/** What a requester receives for `error`, as Nest's RPC exception filter would send it. */
async function rpcPayload(error: unknown): Promise<unknown> {
  const { RpcException } = await loadMicroservices();
  if (error instanceof RpcException) {
    const payload = error.getError();
    return typeof payload === 'object' && payload !== null ? payload : { status: 'error', message: payload };
  }
  if (error instanceof HttpException) return { status: 'error', statusCode: error.getStatus(), message: error.message };
  return { status: 'error', message: 'Internal server error' };
}

/** An `RpcException`, so Nest's filter sends `payload` to a requester as it is instead of "Internal server error". */
async function rpcError(payload: unknown): Promise<Error> {
  const { RpcException } = await loadMicroservices();
  return new RpcException(typeof payload === 'string' ? { status: 'error', message: payload } : (payload as object));
}

function field(data: unknown, name: string): unknown {
  return data !== null && typeof data === 'object' ? (data as Record<string, unknown>)[name] : undefined;
}

function nonEmpty(value: unknown): string | undefined {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return String(value);
  return typeof value === 'string' && value !== '' ? value : undefined;
}
