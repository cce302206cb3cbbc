import { HttpException, HttpStatus } from '@nestjs/common';
import type { KeyRejection } from '../core/key-rejection.js';
import type { StoredResponse } from '../core/idempotency-store.js';
import { messages } from './messages.js';
import { ProblemType } from '../core/protocol.js';

export { PROBLEM_TYPE_BASE, ProblemType } from '../core/protocol.js';

export interface ProblemDetails {
  type: string;
  title: string;
  status: number;
  detail: string;
}

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/**
 * The bytes of a problem answer as the module sends them, whatever exception
 * filter the application has: clients and proxies rely on its `type` and
 * `Retry-After`, so its shape is the module's, not the app's.
 */
export function problemResponse(exception: IdempotencyProblemException): StoredResponse {
  const headers: Array<[string, string]> = [['content-type', PROBLEM_CONTENT_TYPE]];
  if (exception.retryAfterSeconds !== undefined) headers.push(['retry-after', String(exception.retryAfterSeconds)]);
  return { status: exception.problem.status, headers, body: Buffer.from(JSON.stringify(exception.problem), 'utf8') };
}

/**
 * An error response the module produces itself. Its body is an RFC 9457
 * problem; the interceptor sets `Content-Type: application/problem+json` (and
 * `Retry-After` where due) before throwing it, so Nest's exception layer
 * sends it as it is. These responses are never stored.
 */
export class IdempotencyProblemException extends HttpException {
  constructor(
    readonly problem: ProblemDetails,
    readonly retryAfterSeconds?: number,
    options?: { cause?: unknown },
  ) {
    super(problem, problem.status, options);
  }
}

function problem(type: string, title: string, status: number, detail: string): ProblemDetails {
  return { type, title, status, detail };
}

export const problems = {
  missingKey: (header: string) =>
    new IdempotencyProblemException(
      problem(ProblemType.missingKey, 'Idempotency key required', HttpStatus.BAD_REQUEST, messages.problems.missingKey(header)),
    ),
  invalidKey: (reason: KeyRejection, detail: string) =>
    new IdempotencyProblemException(
      problem(
        ProblemType.invalidKey,
        reason === 'missing' ? 'Idempotency key required' : 'Invalid idempotency key',
        HttpStatus.BAD_REQUEST,
        detail,
      ),
    ),
  conflict: (retryAfterSeconds: number) =>
    new IdempotencyProblemException(
      problem(ProblemType.conflict, 'Request in progress', HttpStatus.CONFLICT, messages.problems.conflict),
      retryAfterSeconds,
    ),
  mismatch: () =>
    new IdempotencyProblemException(
      problem(ProblemType.mismatch, 'Idempotency key reused', HttpStatus.UNPROCESSABLE_ENTITY, messages.problems.mismatch),
    ),
  leaseLost: () =>
    new IdempotencyProblemException(
      problem(ProblemType.leaseLost, 'Lease lost', HttpStatus.CONFLICT, messages.problems.leaseLost),
      1,
    ),
  unavailable: (retryAfterSeconds: number, cause: unknown, outcome: 'not-run' | 'unknown') =>
    new IdempotencyProblemException(
      problem(
        ProblemType.unavailable,
        'Idempotency store unavailable',
        HttpStatus.SERVICE_UNAVAILABLE,
        outcome === 'not-run' ? messages.problems.unavailable : messages.problems.outcomeUnknown,
      ),
      retryAfterSeconds,
      { cause },
    ),
  tenantUnresolved: () =>
    new IdempotencyProblemException(
      problem(
        ProblemType.tenantUnresolved,
        'Tenant not resolved',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.tenantUnresolved,
      ),
    ),
  unrepresentableBody: (reason: string) =>
    new IdempotencyProblemException(
      problem(
        ProblemType.unrepresentableBody,
        'Request cannot be fingerprinted',
        HttpStatus.BAD_REQUEST,
        messages.problems.unrepresentableBody(reason),
      ),
    ),
  storeFailed: () =>
    new IdempotencyProblemException(
      problem(
        ProblemType.storeFailed,
        'Idempotency store error',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.storeFailed,
      ),
    ),
  commitRefused: () =>
    new IdempotencyProblemException(
      problem(
        ProblemType.commitRefused,
        'Request not committed',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.commitRefused,
      ),
    ),
  responseTooLarge: (route: string, maxBytes: number, cause: unknown) =>
    new IdempotencyProblemException(
      problem(
        ProblemType.responseTooLarge,
        'Response too large to store',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.responseTooLarge(route, maxBytes),
      ),
      undefined,
      { cause },
    ),
  responseNotSent: (cause: unknown) =>
    new IdempotencyProblemException(
      problem(
        ProblemType.responseNotSent,
        'Response not finished',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.responseNotSent,
      ),
      undefined,
      { cause },
    ),
  unreplayable: (cause: unknown) =>
    new IdempotencyProblemException(
      problem(
        ProblemType.unreplayable,
        'Response cannot be stored',
        HttpStatus.INTERNAL_SERVER_ERROR,
        messages.problems.unreplayable,
      ),
      undefined,
      { cause },
    ),
};
