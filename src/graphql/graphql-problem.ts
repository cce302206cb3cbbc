import { IntrinsicException } from '@nestjs/common';
import type { IdempotencyProblemException } from '../errors/problems.js';
import { PROBLEM_TYPE_BASE } from '../errors/problems.js';

/** What a GraphQL client reads off a module error: a stable code, and the problem type and status the HTTP routes use. */
export interface IdempotencyErrorExtensions {
  /** The problem type's last segment in upper snake case: `CONFLICT`, `MISMATCH`, `MISSING_KEY`, `LEASE_LOST`, ... */
  code: string;
  /** The problem type URI, as in an HTTP route's problem+json (`urn:nest-idempotency:problem:conflict`). */
  type: string;
  /** The HTTP status the same problem has on an HTTP route. */
  status: number;
  /** Seconds to wait before retrying (a conflict, an unavailable store). */
  retryAfter?: number;
}

/**
 * A module error as a resolver throws it. GraphQL (graphql-js 16) copies an
 * original error's `extensions` into the GraphQL error it reports, so no
 * import of `graphql` is needed here, and Apollo and Mercurius keep the code.
 *
 * An `IntrinsicException`, so Nest's exception layer for GraphQL (which logs
 * every other error as `ERROR [ExceptionsHandler]`, stack and all) leaves it
 * alone, as its HTTP layer leaves an `HttpException`: most of these are the
 * client's mistakes (400, 409, 422), and the module logs its own server-side
 * failures (500, 503) itself, once, where they happen.
 */
export class IdempotencyGraphQLError extends IntrinsicException {
  readonly extensions: IdempotencyErrorExtensions;

  constructor(problem: IdempotencyProblemException) {
    super(problem.problem.detail, { cause: problem });
    this.name = 'IdempotencyGraphQLError';
    const slug = problem.problem.type.startsWith(PROBLEM_TYPE_BASE)
      ? problem.problem.type.slice(PROBLEM_TYPE_BASE.length)
      : problem.problem.type;
    this.extensions = {
      code: slug.replace(/-/g, '_').toUpperCase(),
      type: problem.problem.type,
      status: problem.problem.status,
      ...(problem.retryAfterSeconds !== undefined ? { retryAfter: problem.retryAfterSeconds } : {}),
    };
  }
}

/**
 * A resolver's definite error as it was stored, answered the first time.
 * The answer is the stored form, so the replays that follow are the same;
 * the error is an ordinary one with the resolver's own stack, so Nest logs
 * it as it would have logged the resolver's error without the module.
 */
export class StoredGraphQLError extends Error {
  constructor(
    message: string,
    readonly extensions: Record<string, unknown>,
    thrown: unknown,
  ) {
    super(message, { cause: thrown });
    this.name = 'StoredGraphQLError';
    if (thrown instanceof Error && thrown.stack) this.stack = thrown.stack;
  }
}

/**
 * A stored definite error of a resolver, thrown again on every replay with
 * its message and extensions. Nest logged the resolver's error when it was
 * thrown; a replay is an answer from the store and nothing new went wrong,
 * so it is intrinsic too: not logged again, with a stack into this module.
 */
export class ReplayedGraphQLError extends IntrinsicException {
  constructor(
    message: string,
    readonly extensions: Record<string, unknown>,
  ) {
    super(message);
    this.name = 'ReplayedGraphQLError';
  }
}
