import { HttpException } from '@nestjs/common';
import { CommitRefusedError } from '../core/errors.js';
import type { StoredResponse } from '../core/idempotency-store.js';
import type { FailureReading } from '../core/outcomes.js';
import { messages } from '../errors/messages.js';
import { IdempotencyProblemException, problemResponse, problems } from '../errors/problems.js';
import { ResponseNotSentError, ResponseTooLargeError, UnreplayableResponseError } from '../http/capture-errors.js';
import type { ResponseCapture } from '../http/response-capture.js';
import type { RouteSettings } from '../http/route-settings-type.js';
import type { OnceSubscriber } from './once-subscriber.js';
import { problemForOutcome } from './outcome-answers.js';
import type { IdempotencyRuntime } from './run-idempotent.js';

/*
 * An HTTP route's failures (see `HttpTransport`): what a failure of the
 * handler means for its key, read from what reached the wire, and the
 * answer to an error of the module. A new key that succeeds runs none of it.
 */

/** What of an HTTP request (its `HttpTransport`) a failure is read and answered with. */
export interface HttpFailureScope {
  runtime: IdempotencyRuntime;
  route: RouteSettings;
  wire: ResponseCapture;
  out: OnceSubscriber;
}

/**
 * The handler returned, but what reached the wire is an error: something
 * outside the handler (an outer interceptor, the serializer) failed, so the
 * client did not get the handler's success and its writes must not commit.
 */
export class FailedAfterHandlerError extends Error {
  constructor(readonly response: StoredResponse) {
    super(`The response failed after the handler returned (status ${response.status}).`);
  }
}

/** Reads a failure of the handler, once its writes rolled back (see `Transport.readFailure`). */
export async function readHttpFailure(error: unknown, { wire, out, route }: HttpFailureScope): Promise<FailureReading> {
  if (error instanceof UnreplayableResponseError) return { action: 'release' };
  if (error instanceof ResponseNotSentError) return { action: 'keep' };
  // The handler's success was rendered, but nothing of it committed: the module answers, as for an error the handler threw.
  if (error instanceof CommitRefusedError)
    return { definite: false, response: async () => problemResponse(problems.commitRefused()) };
  // The app renders the error (its filters), and that rendering is what a 'store' policy keeps.
  out.fail(error);
  const sent =
    error instanceof FailedAfterHandlerError ? error.response : await wire.sent(route.options.leaseMs).catch(() => null);
  // An error rendered too large to store is refused like a success would be: nothing stored, the key free.
  if (wire.refusal) return { action: 'release' };
  if (!sent) return { action: 'keep' };
  return { definite: isDefinite(error, sent.status), response: async () => sent };
}

/** Answers an error of the engine (409, 422, 503, ...), or the app's own (see `Transport.fail`). */
export function failHttp(error: unknown, key: string, scope: HttpFailureScope): void {
  const { wire, out, runtime, route } = scope;
  const problem = problemFor(error, key, scope) ?? (wire.refusal ? problemFor(wire.refusal, key, scope) : undefined);
  if (problem) return send(problem, scope);
  if (out.emitted) {
    // The store failed after the handler's success was handed on: that success never committed, so it must not go out.
    runtime.logger.error(messages.log.storeFailed(route.name), error instanceof Error ? error.stack : String(error));
    return send(problems.storeFailed(), scope);
  }
  wire.release();
  out.fail(error);
}

/** The module's problem goes out as the module renders it, whatever the app's exception filter does. */
function send(problem: IdempotencyProblemException, { wire, out }: HttpFailureScope): void {
  wire.replace(problemResponse(problem));
  out.fail(problem);
}

function problemFor(error: unknown, key: string, { runtime, route }: HttpFailureScope): IdempotencyProblemException | undefined {
  const { logger, options } = runtime;
  const routeName = route.name;
  if (error instanceof ResponseTooLargeError) {
    logger.error(messages.log.responseTooLarge(routeName, error.maxBytes));
    return problems.responseTooLarge(routeName, error.maxBytes, error);
  }
  if (error instanceof ResponseNotSentError) {
    logger.error(messages.log.responseNotSent(routeName, error.waitedMs));
    return problems.responseNotSent(error);
  }
  if (error instanceof UnreplayableResponseError) {
    logger.error(messages.config.unreplayableRoute(routeName, error.message));
    return problems.unreplayable(error);
  }
  return problemForOutcome(error, options.unavailableRetryAfter, routeName, key, logger);
}

/**
 * A definite outcome (stored by the `onHttpException` policy) is a 4xx the
 * handler threw, or one the client got when something after the handler
 * failed; a 5xx, thrown or not, is an outcome nobody knows.
 */
function isDefinite(error: unknown, status: number): boolean {
  return error instanceof HttpException ? error.getStatus() < 500 : status < 500 && error instanceof FailedAfterHandlerError;
}
