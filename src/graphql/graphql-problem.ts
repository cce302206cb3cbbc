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
 */
export class IdempotencyGraphQLError extends Error {
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

/** A stored definite error of a resolver, thrown again on every replay with its message and extensions. */
export class ReplayedGraphQLError extends Error {
  constructor(
    message: string,
    readonly extensions: Record<string, unknown>,
  ) {
    super(message);
    this.name = 'ReplayedGraphQLError';
  }
}
