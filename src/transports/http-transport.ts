import { HttpException } from '@nestjs/common';
import type { Observable } from 'rxjs';
import { CommitRefusedError } from '../core/errors.js';
import { fingerprintRequest } from '../core/fingerprint.js';
import type { StoredResponse } from '../core/idempotency-store.js';
import { parseIdempotencyKey } from '../core/key.js';
import type { FailureReading } from '../core/outcomes.js';
import type { EngineOutcome } from '../core/work.js';
import { messages } from '../errors/messages.js';
import { IdempotencyProblemException, problemResponse, problems } from '../errors/problems.js';
import { captureResponse } from '../http/capture.js';
import { fingerprintInput, headerValues, serverResponse, type HttpRequest } from '../http/request-identity.js';
import { ResponseNotSentError, type ResponseCapture } from '../http/response-capture.js';
import { describeUnreplayable, ResponseTooLargeError, UnreplayableResponseError } from '../http/unreplayable.js';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import { OnceSubscriber } from './once-subscriber.js';
import { problemForOutcome } from './outcome-answers.js';
import { NestTransport, type Done } from './run-idempotent.js';

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
 * An HTTP route: the key from its header, the response taken where the
 * platform sends it (`captureResponse`: after every interceptor, serializer
 * and exception filter of the app, before content encoding), so what is
 * stored and replayed is what the client got, and let go only once its
 * outcome is committed.
 */
export class HttpTransport extends NestTransport {
  private readonly http = this.context.switchToHttp();
  private readonly request = this.http.getRequest<HttpRequest>();
  private readonly wire: ResponseCapture = captureResponse(this.http.getResponse(), {
    replayHeaders: this.runtime.options.replayHeaders,
    maxBytes: this.route.options.maxResponseBytes,
  });
  private readonly out = new OnceSubscriber(this.subscriber);

  readKey(): string | undefined {
    const values = headerValues(this.request, this.runtime.options.header);
    if (values.length === 0) return undefined;
    const parsed = parseIdempotencyKey(values, this.runtime.options.maxKeyLength);
    if (!parsed.ok) throw problems.invalidKey(parsed.reason, parsed.detail);
    return parsed.key;
  }

  fingerprint(): string {
    return fingerprintRequest(fingerprintInput(this.request, this.route.name));
  }

  async invoke(): Promise<Done<unknown>> {
    const value = await lastValueOf(this.next.handle());
    const unreplayable = describeUnreplayable(value);
    if (unreplayable) throw new UnreplayableResponseError(unreplayable);
    this.out.emit(value);
    const sent = await this.wire.sent(this.route.options.leaseMs);
    if (sent.status >= 400) throw new FailedAfterHandlerError(sent);
    return { response: sent, result: value };
  }

  async readFailure(error: unknown): Promise<FailureReading> {
    if (error instanceof UnreplayableResponseError) return { action: 'release' };
    if (error instanceof ResponseNotSentError) return { action: 'keep' };
    // The handler's success was rendered, but nothing of it committed: the module answers, as for an error the handler threw.
    if (error instanceof CommitRefusedError)
      return { definite: false, response: async () => problemResponse(problems.commitRefused()) };
    // The app renders the error (its filters), and that rendering is what a 'store' policy keeps.
    this.out.fail(error);
    const sent =
      error instanceof FailedAfterHandlerError
        ? error.response
        : await this.wire.sent(this.route.options.leaseMs).catch(() => null);
    // An error rendered too large to store is refused like a success would be: nothing stored, the key free.
    if (this.wire.refusal) return { action: 'release' };
    if (!sent) return { action: 'keep' };
    return { definite: isDefinite(error, sent.status), response: async () => sent };
  }

  runWithoutKey(): void {
    this.wire.release();
    this.runtime.withoutIdempotency(() => this.next.handle()).subscribe(this.subscriber);
  }

  answer(outcome: EngineOutcome<unknown>): void {
    if (outcome.kind === 'replayed') {
      // Set now, so the app's outer interceptors can tell a replay from the response they are handed.
      serverResponse(this.http.getResponse()).setHeader(REPLAYED_HEADER, 'true');
      this.wire.replace(outcome.response, [[REPLAYED_HEADER, 'true']]);
      // Nest still runs the app's outer interceptors and sends; the wire swaps in the stored bytes.
      this.out.emit(undefined);
    } else if (outcome.kind === 'failure-stored' && outcome.error instanceof CommitRefusedError) {
      // What the wire holds is the success that never committed; the stored answer goes out instead.
      this.wire.replace(outcome.response);
    } else {
      this.wire.release();
    }
  }

  fail(error: unknown, key: string): void {
    const problem = this.problemFor(error, key) ?? (this.wire.refusal ? this.problemFor(this.wire.refusal, key) : undefined);
    if (problem) return this.send(problem);
    if (this.out.emitted) {
      // The store failed after the handler's success was handed on: that success never committed, so it must not go out.
      this.runtime.logger.error(messages.log.storeFailed(this.route.name), error instanceof Error ? error.stack : String(error));
      return this.send(problems.storeFailed());
    }
    this.wire.release();
    this.out.fail(error);
  }

  /** The module's problem goes out as the module renders it, whatever the app's exception filter does. */
  private send(problem: IdempotencyProblemException): void {
    this.wire.replace(problemResponse(problem));
    this.out.fail(problem);
  }

  private problemFor(error: unknown, key: string): IdempotencyProblemException | undefined {
    const { logger, options } = this.runtime;
    const routeName = this.route.name;
    if (error instanceof ResponseTooLargeError) {
      logger.error(messages.log.responseTooLarge(routeName, error.maxBytes));
      return problems.responseTooLarge(routeName, error.maxBytes, error);
    }
    if (error instanceof UnreplayableResponseError) {
      logger.error(messages.config.unreplayableRoute(routeName, error.message));
      return problems.unreplayable(error);
    }
    return problemForOutcome(error, options.unavailableRetryAfter, routeName, key, logger);
  }
}

/**
 * The handler's last value, or undefined when it completes with none: what
 * `lastValueFrom(source.pipe(defaultIfEmpty(undefined)))` gives, without an
 * operator chain built per request.
 */
export function lastValueOf(source: Observable<unknown>): Promise<unknown> {
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
