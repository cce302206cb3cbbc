import type { Logger } from '@nestjs/common';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
  UnrepresentableInputError,
} from '../core/errors.js';
import { redactKey } from '../core/redact-key.js';
import { messages } from '../errors/messages.js';
import { IdempotencyProblemException, ProblemType, problems } from '../errors/problems.js';

/*
 * The transports' faces of the engine's outcomes (see core/outcomes.ts for
 * what each one means): a problem document for HTTP and GraphQL, a
 * requeue or a dead letter for a message.
 */

/**
 * The module's own answer to an error, as a problem (HTTP sends it as
 * problem+json, GraphQL as an error with its extensions), or undefined when
 * the error is the application's.
 */
export function problemForOutcome(
  error: unknown,
  unavailableRetryAfter: number,
  routeName: string,
  key: string,
  logger: Logger,
): IdempotencyProblemException | undefined {
  if (error instanceof IdempotencyProblemException) return error;
  if (error instanceof KeyInFlightError) return problems.conflict(error.retryAfterSeconds);
  if (error instanceof FingerprintMismatchError) return problems.mismatch();
  if (error instanceof UnrepresentableInputError) return problems.unrepresentableBody(error.reason);
  if (error instanceof LeaseLostError) {
    logger.warn(messages.log.leaseLost(routeName, redactKey(key)));
    return problems.leaseLost();
  }
  if (error instanceof CommitRefusedError) {
    const code = (error.cause as { code?: unknown } | undefined)?.code;
    logger.error(messages.log.commitRefused(routeName, typeof code === 'string' ? code : 'unknown'));
    return problems.commitRefused();
  }
  if (error instanceof StoreUnavailableError) {
    logger.error(messages.log.unavailable(routeName));
    return problems.unavailable(error.retryAfterSeconds ?? unavailableRetryAfter, error.cause, error.outcome);
  }
  return undefined;
}

/** After a lost lease another delivery holds the key: look again shortly, when it has settled or holds a lease to wait for. */
const LEASE_LOST_RETRY_MS = 1_000;

/** What happens to a message the engine answered with `error`, or undefined when the error is the handler's. */
export type MessageAnswer = { requeue: { delayMs: number; why: string; type: string } } | { deadLetter: string } | undefined;

export function messageAnswerFor(error: unknown, unavailableRetryAfter: number): MessageAnswer {
  if (error instanceof KeyInFlightError) {
    return { requeue: { delayMs: error.retryAfterSeconds * 1000, why: messages.consumer.inFlight, type: ProblemType.conflict } };
  }
  if (error instanceof LeaseLostError) {
    return { requeue: { delayMs: LEASE_LOST_RETRY_MS, why: messages.consumer.leaseLost, type: ProblemType.leaseLost } };
  }
  if (error instanceof StoreUnavailableError) {
    const delayMs = (error.retryAfterSeconds ?? unavailableRetryAfter) * 1000;
    return { requeue: { delayMs, why: messages.consumer.unavailable, type: ProblemType.unavailable } };
  }
  if (error instanceof FingerprintMismatchError) return { deadLetter: messages.consumer.mismatch };
  return undefined;
}

/** Why a message refused before anything was claimed is dead-lettered, or undefined when nothing explains it (a bug). */
export function messageRefusal(error: unknown, step: 'key' | 'tenant' | 'fingerprint', maxKeyLength: number): string | undefined {
  if (step === 'tenant') return messages.consumer.tenantUnresolved;
  if (step === 'fingerprint') {
    return error instanceof UnrepresentableInputError ? messages.consumer.unrepresentable(error.reason) : undefined;
  }
  const invalid = error instanceof IdempotencyProblemException && error.problem.type === ProblemType.invalidKey;
  return invalid ? messages.consumer.invalidKey(maxKeyLength) : messages.consumer.missingKey;
}
