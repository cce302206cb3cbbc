import {
  HttpException,
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
  type Type,
} from '@nestjs/common';
import { defaultIfEmpty, lastValueFrom, Observable, type Subscriber } from 'rxjs';
import type { EngineOutcome } from '../core/idempotency-engine.js';
import {
  FingerprintMismatchError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
  UnrepresentableInputError,
} from '../core/errors.js';
import { fingerprintValue } from '../core/fingerprint.js';
import { messages } from '../errors/messages.js';
import { ProblemType } from '../errors/problems.js';
import { IdempotentRoutes, type RouteSettings } from '../http/route-settings.js';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { FailurePolicy, ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { decodeOutcome, encodeOutcome, resolveTenant, runHandler } from '../entry-point.js';
import { IdempotencyService } from '../idempotency.service.js';
import { messageDelivery, type MessageDelivery } from './message-delivery.js';

/** Set by `@EventPattern` (2) and `@MessagePattern` (1) on the handler (@nestjs/microservices' PatternHandler). */
const HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER = 2;
/** The payload field read for the key when the broker gives no message id. */
const DEFAULT_KEY_FIELD = 'idempotencyKey';
const VISIBLE_ASCII = /^[\x21-\x7e]+$/;
/** After a lost lease another delivery holds the key: look again shortly, when it has settled or holds a lease to wait for. */
const LEASE_LOST_RETRY_MS = 1_000;

/** A delivery whose message was already attempted `maxDeliveries` times: dead-lettered before the handler runs again. */
class PoisonMessageError extends Error {
  constructor(readonly attempts: number) {
    super(`The message was already attempted ${attempts} times.`);
  }
}

/** Deliveries already handled (class- and method-level `@Idempotent()` both apply the interceptor). */
const handledDeliveries = new WeakSet<object>();

type Microservices = typeof import('@nestjs/microservices');
let microservices: Promise<Microservices> | undefined;
/** Loaded on the first message only: a message context exists only where the package is installed. */
const loadMicroservices = () => (microservices ??= import('@nestjs/microservices'));

/**
 * The message face of the engine, for `@Idempotent()` on `@EventPattern` and
 * `@MessagePattern` handlers: reads the key from the message, runs the
 * handler through `IdempotencyService` (so `TransactionHost` gives the
 * handler the transaction its completion commits in), and settles the
 * message with the broker only once that outcome is committed.
 *
 * The handler's writes and the completion commit before the message is
 * acknowledged; a redelivery of a completed message is acknowledged without
 * running (a `MessagePattern` gets the stored reply); a duplicate that finds
 * the key in flight is requeued after its Retry-After; a message that can
 * never be processed (no key, another message's key, a handler that failed
 * `maxDeliveries` times) is dead-lettered.
 */
@Injectable()
export class IdempotentMessageInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');

  constructor(
    private readonly routes: IdempotentRoutes,
    private readonly service: IdempotencyService,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'rpc') return next.handle();
    const rpcContext = context.switchToRpc().getContext<unknown>();
    if (rpcContext !== null && typeof rpcContext === 'object') {
      if (handledDeliveries.has(rpcContext)) return next.handle();
      handledDeliveries.add(rpcContext);
    }
    const handler = context.getHandler() as (...args: unknown[]) => unknown;
    const route = this.routes.get(context.getClass<Type>(), handler);
    if (!route) return next.handle();
    const expectsReply = Reflect.getMetadata(HANDLER_TYPE_METADATA, handler) !== EVENT_HANDLER;
    return new Observable((subscriber) => {
      const reply = new Reply(subscriber, expectsReply);
      const delivery = messageDelivery(context.switchToRpc().getContext(), (action, error) =>
        this.logger.error(
          messages.consumer.settleFailed(route.name, action, error instanceof Error ? error.message : String(error)),
        ),
      );
      this.consume(context, next, route, delivery, reply).catch((error: unknown) => {
        // A bug (a custom fingerprint function that threw): kept for a person to look at, never retried in a loop.
        this.logger.error(messages.consumer.unexpected(route.name), error instanceof Error ? error.stack : String(error));
        delivery.deadLetter(messages.consumer.unexpected(route.name));
        reply.fail(error);
      });
    });
  }

  private async consume(
    context: ExecutionContext,
    next: CallHandler,
    route: RouteSettings,
    delivery: MessageDelivery,
    reply: Reply,
  ): Promise<void> {
    const deadLetter = async (reason: string, cause?: unknown) => {
      this.logger.warn(messages.consumer.deadLettered(route.name, reason));
      delivery.deadLetter(reason);
      reply.fail(cause ?? (await this.rpcError(reason)));
    };
    const requeue = async (delayMs: number, why: string, type: string) => {
      const retryAfter = Math.max(1, Math.ceil(delayMs / 1000));
      if (!delivery.settles) {
        // Nothing to requeue on this transport (TCP, core NATS): the sender learns it must retry, as an HTTP 409 says.
        return reply.fail(await this.rpcError({ status: 'error', type, message: why, retryAfter }));
      }
      this.logger.log(messages.consumer.requeued(route.name, retryAfter, why));
      delivery.retry(delayMs);
      // No answer now: the redelivery answers a MessagePattern's requester, with the stored reply.
      reply.hold();
    };

    let key: string | undefined;
    try {
      key = this.keyOf(route, context, delivery);
    } catch (error) {
      return deadLetter(messages.consumer.missingKey, error);
    }
    if (key === undefined) {
      if (route.options.required) return deadLetter(messages.consumer.missingKey);
      return this.runWithoutKey(route, next, delivery, reply);
    }
    if (key.length > this.options.maxKeyLength || !VISIBLE_ASCII.test(key)) {
      return deadLetter(messages.consumer.invalidKey(this.options.maxKeyLength));
    }
    const tenant = await resolveTenant(this.options, context, route.name, this.logger).catch(() => undefined);
    if (tenant === undefined) return deadLetter(messages.consumer.tenantUnresolved);

    let attempt = 1;
    let startedAt = Date.now();
    let policy = 'keep' as FailurePolicy | 'rejected';
    try {
      let outcome: EngineOutcome<unknown>;
      try {
        outcome = await runHandler(this.service, {
          route,
          context,
          tenant,
          key,
          defaultFingerprint: () =>
            fingerprintValue({ pattern: delivery.pattern ?? route.name, data: context.switchToRpc().getData<unknown>() ?? null }),
          run: async (claim) => {
            attempt = claim.attempt;
            // Attempts that never reached a verdict (the process crashed, was killed or ran out of memory) count too:
            // the key row counts them; a claim that rolls back with its work (request-transaction) keeps no count, so
            // there the broker's (which also counts requeues of a duplicate that found the key in flight) decides.
            const brokerCount = route.options.claimMode === 'request-transaction' ? (delivery.deliveryCount ?? 1) : 1;
            const attempted = Math.max(claim.attempt, brokerCount) - 1;
            if (attempted >= route.options.maxDeliveries) throw new PoisonMessageError(attempted);
            startedAt = Date.now();
            const value = await lastValueFrom(next.handle().pipe(defaultIfEmpty(undefined)));
            return { response: encodeOutcome({ value: value ?? null }, 200), result: value };
          },
          // A poison message is dead-lettered; its key goes, so a redrive after a fix starts with a fresh count.
          readFailure: async (error) =>
            error instanceof PoisonMessageError
              ? { action: 'release', forget: true }
              : {
                  definite: await this.isDefinite(error),
                  response: async () => encodeOutcome({ error: await this.rpcPayload(error) }, 400),
                },
          decided: (decided) => (policy = decided),
        });
      } catch (error) {
        if (error instanceof UnrepresentableInputError) return deadLetter(messages.consumer.unrepresentable(error.reason));
        throw error;
      }
      // Committed (or found committed): only now may the broker forget the message.
      delivery.ack();
      const stored = decodeOutcome(outcome.response);
      if ('error' in stored) return reply.fail(await this.rpcError(stored.error));
      return reply.emit(stored.value);
    } catch (error) {
      if (error instanceof KeyInFlightError) {
        return requeue(error.retryAfterSeconds * 1000, messages.consumer.inFlight, ProblemType.conflict);
      }
      if (error instanceof LeaseLostError)
        return requeue(LEASE_LOST_RETRY_MS, messages.consumer.leaseLost, ProblemType.leaseLost);
      if (error instanceof StoreUnavailableError) {
        const delayMs = (error.retryAfterSeconds ?? this.options.unavailableRetryAfter) * 1000;
        return requeue(delayMs, messages.consumer.unavailable, ProblemType.unavailable);
      }
      if (error instanceof FingerprintMismatchError) return deadLetter(messages.consumer.mismatch);
      if (error instanceof PoisonMessageError) return deadLetter(messages.consumer.poisoned(error.attempts));
      if (policy === 'rejected') return deadLetter(messages.consumer.rejected, error);
      return this.afterHandlerFailure(route, delivery, reply, error, policy, attempt, startedAt, deadLetter);
    }
  }

  /**
   * The handler failed and its key was kept (or released): deliver the
   * message again, once the lease lets a redelivery take the key over, or
   * dead-letter it once it has failed `maxDeliveries` times. The count is
   * the key's attempts (one more per takeover), or the broker's own count
   * where it keeps one; a released key keeps no count, so without the
   * broker's the message is dead-lettered at once rather than loop.
   */
  private async afterHandlerFailure(
    route: RouteSettings,
    delivery: MessageDelivery,
    reply: Reply,
    error: unknown,
    policy: FailurePolicy,
    attempt: number,
    startedAt: number,
    deadLetter: (reason: string, cause?: unknown) => Promise<void>,
  ): Promise<void> {
    const max = route.options.maxDeliveries;
    // A released key, or a claim that rolled back with the work (request-transaction), keeps no count of its attempts.
    const uncounted = policy === 'release' || route.options.claimMode === 'request-transaction';
    const counted = delivery.deliveryCount ?? (uncounted ? max : 0);
    const deliveries = Math.max(attempt, counted);
    if (!delivery.settles) return reply.fail(error);
    if (deliveries >= max) return deadLetter(messages.consumer.failed(deliveries), error);
    const delayMs = policy === 'keep' ? Math.max(1_000, startedAt + route.options.leaseMs - Date.now()) : 0;
    this.logger.warn(messages.consumer.handlerFailed(route.name, deliveries, max, Math.ceil(delayMs / 1000)));
    delivery.retry(delayMs);
    // An event's error goes on to Nest, which logs it; a requester waits for the redelivery's answer.
    if (reply.expectsReply) reply.hold();
    else reply.fail(error);
  }

  /** Runs a message without a key on a route that allows it (`required: false`): no idempotency, settled by its outcome. */
  private runWithoutKey(route: RouteSettings, next: CallHandler, delivery: MessageDelivery, reply: Reply): void {
    this.service.runWithoutIdempotency(() =>
      next.handle().subscribe({
        next: (value) => reply.value(value),
        error: (error: unknown) => {
          // Without a key nothing counts its attempts: the broker's dead-letter route decides what comes next.
          this.logger.warn(messages.consumer.deadLettered(route.name, messages.consumer.failedWithoutKey));
          delivery.deadLetter(messages.consumer.failedWithoutKey);
          reply.fail(error);
        },
        complete: () => {
          delivery.ack();
          reply.complete();
        },
      }),
    );
  }

  private keyOf(route: RouteSettings, context: ExecutionContext, delivery: MessageDelivery): string | undefined {
    const option = route.options.key;
    if (typeof option === 'function') return nonEmpty(option(context));
    const data = context.switchToRpc().getData<unknown>();
    if (typeof option === 'string') return nonEmpty(field(data, option));
    return delivery.messageId ?? nonEmpty(field(data, DEFAULT_KEY_FIELD));
  }

  /** A definite outcome, stored by the `onHttpException` policy: an `RpcException`, or an `HttpException` below 500. */
  private async isDefinite(error: unknown): Promise<boolean> {
    if (error instanceof HttpException) return error.getStatus() < 500;
    const { RpcException } = await loadMicroservices();
    return error instanceof RpcException;
  }

  /** What a requester receives for `error`, as Nest's RPC exception filter would send it. */
  private async rpcPayload(error: unknown): Promise<unknown> {
    const { RpcException } = await loadMicroservices();
    if (error instanceof RpcException) {
      const payload = error.getError();
      return typeof payload === 'object' && payload !== null ? payload : { status: 'error', message: payload };
    }
    if (error instanceof HttpException) return { status: 'error', statusCode: error.getStatus(), message: error.message };
    return { status: 'error', message: 'Internal server error' };
  }

  /** An `RpcException`, so Nest's filter sends `payload` to a requester as it is instead of "Internal server error". */
  private async rpcError(payload: unknown): Promise<Error> {
    const { RpcException } = await loadMicroservices();
    return new RpcException(typeof payload === 'string' ? { status: 'error', message: payload } : (payload as object));
  }
}

/**
 * Answers the Observable Nest subscribed to, once. A `MessagePattern`'s value
 * is its reply; an event's value goes nowhere. `hold()` answers nothing: the
 * message was requeued and its redelivery answers the requester, which an
 * empty completion now would instead tell "no reply".
 */
class Reply {
  private done = false;
  constructor(
    private readonly subscriber: Subscriber<unknown>,
    readonly expectsReply: boolean,
  ) {}

  emit(value: unknown): void {
    if (this.settle()) {
      this.subscriber.next(value);
      this.subscriber.complete();
    }
  }

  /** A value of a handler run without a key, passed on as it comes. */
  value(value: unknown): void {
    if (!this.done) this.subscriber.next(value);
  }

  complete(): void {
    if (this.settle()) this.subscriber.complete();
  }

  fail(error: unknown): void {
    if (this.settle()) this.subscriber.error(error);
  }

  hold(): void {
    if (this.settle() && !this.expectsReply) this.subscriber.complete();
  }

  private settle(): boolean {
    if (this.done) return false;
    this.done = true;
    return true;
  }
}

function field(data: unknown, name: string): unknown {
  return data !== null && typeof data === 'object' ? (data as Record<string, unknown>)[name] : undefined;
}

function nonEmpty(value: unknown): string | undefined {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return String(value);
  return typeof value === 'string' && value !== '' ? value : undefined;
}
