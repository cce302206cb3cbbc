import {
  HttpException,
  Inject,
  Injectable,
  Logger,
  Optional,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
  type Type,
} from '@nestjs/common';
import { Observable, type Subscriber } from 'rxjs';
import type { EngineOutcome } from './core/idempotency-engine.js';
import { CommitRefusedError, UnrepresentableInputError } from './core/errors.js';
import { fingerprintRequest } from './core/fingerprint.js';
import { parseIdempotencyKey } from './core/key.js';
import { IdempotencyConfigurationError } from './errors/configuration.error.js';
import { messages } from './errors/messages.js';
import { IdempotencyProblemException, problemResponse, problems } from './errors/problems.js';
import { fingerprintInput, headerValues, serverResponse, type HttpRequest } from './http/request-identity.js';
import { IdempotentRoutes, type RouteSettings } from './http/route-settings.js';
import { captureResponse } from './http/capture.js';
import { ResponseNotSentError } from './http/response-capture.js';
import { describeUnreplayable, ResponseTooLargeError, UnreplayableResponseError } from './http/unreplayable.js';
import { IDEMPOTENCY_OPTIONS, REPLAYED_HEADER } from './idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from './idempotency.options.js';
import { problemForOutcome, resolveTenant, runHandler } from './entry-point.js';
import { IdempotencyService } from './idempotency.service.js';
import { IdempotentResolverInterceptor } from './graphql/idempotent-resolver.interceptor.js';
import { IdempotentMessageInterceptor } from './rpc/idempotent-message.interceptor.js';
import type { StoredResponse } from './core/idempotency-store.js';

/** Requests already handled by an instance of this interceptor (class- and method-level `@Idempotent()` both apply it). */
const handledRequests = new WeakSet<object>();

/**
 * The handler returned, but what reached the wire is an error: something
 * outside the handler (an outer interceptor, the serializer) failed, so the
 * client did not get the handler's success and its writes must not commit.
 */
class FailedAfterHandlerError extends Error {
  constructor(readonly response: StoredResponse) {
    super(`The response failed after the handler returned (status ${response.status}).`);
  }
}

/**
 * The HTTP face of the engine: reads the key, tenant and fingerprint, runs
 * the handler through `IdempotencyService`, and lets the response go once
 * its outcome is committed. The response is taken where the platform sends
 * it (`captureResponse`), after every interceptor, serializer and exception
 * filter of the app and before content encoding, so what is stored and
 * replayed is what the client got.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');

  // Optional, so an app without IdempotencyModule.forRoot() gets a message that says so, not Nest's dependency error.
  constructor(
    @Optional() private readonly routes: IdempotentRoutes,
    @Optional() private readonly service: IdempotencyService,
    @Optional() private readonly messageInterceptor: IdempotentMessageInterceptor,
    @Optional() private readonly resolverInterceptor: IdempotentResolverInterceptor,
    @Optional() @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {
    if (!routes || !service || !messageInterceptor || !resolverInterceptor || !options) {
      throw new IdempotencyConfigurationError(messages.config.moduleNotImported);
    }
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    // One interceptor on every @Idempotent() handler; messages and GraphQL mutations have their own entry points.
    switch (context.getType<string>()) {
      case 'http':
        break;
      case 'rpc':
        return this.messageInterceptor.intercept(context, next);
      case 'graphql':
        return this.resolverInterceptor.intercept(context, next);
      default:
        return next.handle();
    }
    const request = context.switchToHttp().getRequest<HttpRequest>();
    if (handledRequests.has(request)) return next.handle();
    handledRequests.add(request);
    const route = this.routes.get(context.getClass<Type>(), context.getHandler() as (...args: unknown[]) => unknown);
    if (!route) return next.handle();
    return new Observable((subscriber) => void this.exchange(context, next, route, request, subscriber));
  }

  private async exchange(
    context: ExecutionContext,
    next: CallHandler,
    route: RouteSettings,
    request: HttpRequest,
    subscriber: Subscriber<unknown>,
  ): Promise<void> {
    const response = serverResponse(context.switchToHttp().getResponse());
    const wire = captureResponse(context.switchToHttp().getResponse(), {
      replayHeaders: this.options.replayHeaders,
      maxBytes: route.options.maxResponseBytes,
    });
    const out = new Outlet(subscriber);
    let key = '';
    const refuse = (problem: IdempotencyProblemException) => {
      wire.replace(problemResponse(problem));
      out.fail(problem);
    };
    try {
      const values = headerValues(request, this.options.header);
      if (values.length === 0) {
        if (route.options.required) return refuse(problems.missingKey(this.options.header));
        wire.release();
        return void this.service.runWithoutIdempotency(() => next.handle()).subscribe(subscriber);
      }
      const parsed = parseIdempotencyKey(values, this.options.maxKeyLength);
      if (!parsed.ok) return refuse(problems.invalidKey(parsed.reason, parsed.detail));
      key = parsed.key;
      const tenant = await resolveTenant(this.options, context, route.name, this.logger);
      const responseWaitMs = route.options.leaseMs;
      let outcome: EngineOutcome<unknown>;
      try {
        outcome = await runHandler(this.service, {
          route,
          context,
          tenant,
          key,
          defaultFingerprint: () => fingerprintRequest(fingerprintInput(request, route.name)),
          run: async () => {
            const value = await lastValueOf(next.handle());
            const unreplayable = describeUnreplayable(value);
            if (unreplayable) throw new UnreplayableResponseError(unreplayable);
            out.emit(value);
            const sent = await wire.sent(responseWaitMs);
            if (sent.status >= 400) throw new FailedAfterHandlerError(sent);
            return { response: sent, result: value };
          },
          readFailure: async (error: unknown) => {
            if (error instanceof UnreplayableResponseError) return { action: 'release' };
            if (error instanceof ResponseNotSentError) return { action: 'keep' };
            // The handler's success was rendered, but nothing of it committed: the module answers, as for an error the handler threw.
            if (error instanceof CommitRefusedError)
              return { definite: false, response: async () => problemResponse(problems.commitRefused()) };
            // The app renders the error (its filters), and that rendering is what a 'store' policy keeps.
            out.fail(error);
            const sent =
              error instanceof FailedAfterHandlerError ? error.response : await wire.sent(responseWaitMs).catch(() => null);
            // An error rendered too large to store is refused like a success would be: nothing stored, the key free.
            if (wire.refusal) return { action: 'release' };
            if (!sent) return { action: 'keep' };
            return { definite: isDefinite(error, sent.status), response: async () => sent };
          },
        });
      } catch (error) {
        if (error instanceof UnrepresentableInputError) return refuse(problems.unrepresentableBody(error.reason));
        throw error;
      }
      if (outcome.kind === 'replayed') {
        // Set now, so the app's outer interceptors can tell a replay from the response they are handed.
        response.setHeader(REPLAYED_HEADER, 'true');
        wire.replace(outcome.response, [[REPLAYED_HEADER, 'true']]);
        // Nest still runs the app's outer interceptors and sends; the wire swaps in the stored bytes.
        out.emit(undefined);
      } else if (outcome.kind === 'failure-stored' && outcome.error instanceof CommitRefusedError) {
        // What the wire holds is the success that never committed; the stored answer goes out instead.
        wire.replace(outcome.response);
      } else {
        wire.release();
      }
    } catch (error) {
      const problem =
        this.problemFor(error, route.name, key) ?? (wire.refusal ? this.problemFor(wire.refusal, route.name, key) : undefined);
      if (problem) return refuse(problem);
      if (out.emittedValue) {
        // The store failed after the handler's success was handed on: that success never committed, so it must not go out.
        this.logger.error(messages.log.storeFailed(route.name), error instanceof Error ? error.stack : String(error));
        return refuse(problems.storeFailed());
      }
      wire.release();
      out.fail(error);
    }
  }

  /** The module's own answer to an outcome of the engine, or undefined when the error is the app's. */
  private problemFor(error: unknown, routeName: string, key: string): IdempotencyProblemException | undefined {
    if (error instanceof ResponseTooLargeError) {
      this.logger.error(messages.log.responseTooLarge(routeName, error.maxBytes));
      return problems.responseTooLarge(routeName, error.maxBytes, error);
    }
    if (error instanceof UnreplayableResponseError) {
      this.logger.error(messages.config.unreplayableRoute(routeName, error.message));
      return problems.unreplayable(error);
    }
    return problemForOutcome(error, this.options, routeName, key, this.logger);
  }
}

/** Signals the Observable Nest subscribed to, once: a value for the app to send, or an error for its filters. */
class Outlet {
  private done = false;
  /** Whether the handler's value (not an error) was handed on to the app. */
  emittedValue = false;
  constructor(private readonly subscriber: Subscriber<unknown>) {}

  emit(value: unknown): void {
    if (this.done) return;
    this.done = true;
    this.emittedValue = true;
    this.subscriber.next(value);
    this.subscriber.complete();
  }

  fail(error: unknown): void {
    if (this.done) return;
    this.done = true;
    this.subscriber.error(error);
  }
}

/**
 * The handler's last value, or undefined when it completes with none: what
 * `lastValueFrom(source.pipe(defaultIfEmpty(undefined)))` gives, without an
 * operator chain built per request.
 */
function lastValueOf(source: Observable<unknown>): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let last: unknown;
    source.subscribe({ next: (value) => (last = value), error: reject, complete: () => resolve(last) });
  });
}

/**
 * A definite outcome (stored by the `onHttpException` policy) is a 4xx the
 * handler threw, or one the client got when something after the handler
 * failed; a 5xx, thrown or not, is an outcome nobody knows.
 */
function isDefinite(error: unknown, status: number): boolean {
  return error instanceof HttpException ? error.getStatus() < 500 : status < 500 && error instanceof FailedAfterHandlerError;
}
