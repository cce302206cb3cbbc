/**
 * What the server and the client agree on over the wire: the header names and
 * the problem type URIs (RFC 9457 `type`, stable and documented in
 * docs/errors.md). No import at all, so the client (which has no Nest)
 * recognises the module's answers by the same constants the server sends.
 */
/** The request header that carries the idempotency key, unless the module's `header` option names another. */
export const DEFAULT_HEADER = 'Idempotency-Key';
/** Added to every replayed response. */
export const REPLAYED_HEADER = 'Idempotent-Replayed';

export const PROBLEM_TYPE_BASE = 'urn:nest-idempotency:problem:';

export const ProblemType = {
  missingKey: `${PROBLEM_TYPE_BASE}missing-key`,
  invalidKey: `${PROBLEM_TYPE_BASE}invalid-key`,
  conflict: `${PROBLEM_TYPE_BASE}conflict`,
  mismatch: `${PROBLEM_TYPE_BASE}mismatch`,
  leaseLost: `${PROBLEM_TYPE_BASE}lease-lost`,
  unavailable: `${PROBLEM_TYPE_BASE}store-unavailable`,
  tenantUnresolved: `${PROBLEM_TYPE_BASE}tenant-unresolved`,
  unreplayable: `${PROBLEM_TYPE_BASE}unreplayable-response`,
  responseTooLarge: `${PROBLEM_TYPE_BASE}response-too-large`,
  responseNotSent: `${PROBLEM_TYPE_BASE}response-not-sent`,
  unrepresentableBody: `${PROBLEM_TYPE_BASE}unrepresentable-body`,
  storeFailed: `${PROBLEM_TYPE_BASE}store-error`,
  commitRefused: `${PROBLEM_TYPE_BASE}commit-refused`,
} as const;
