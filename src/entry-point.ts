import { HttpException, type ExecutionContext, type Logger } from '@nestjs/common';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './core/errors.js';
import { redactKey } from './core/key.js';
import { messages } from './errors/messages.js';
import { IdempotencyProblemException, problems } from './errors/problems.js';
import type { WorkScope } from './core/idempotency-engine.js';
import type { RouteSettings } from './http/route-settings.js';
import type { ResolvedIdempotencyOptions } from './idempotency.options.js';

/*
 * What every entry point (HTTP routes, GraphQL mutations, message handlers)
 * does alike around the engine: find the tenant, and turn the engine's own
 * outcomes into the module's problems.
 */

/**
 * The tenant of a request, or a problem 500 that fails it closed (logged):
 * there is no shared scope to fall back on. An `HttpException` from the
 * resolver (a 401 for a missing principal) is the resolver's answer and
 * goes out as it is.
 */
export async function resolveTenant(
  options: ResolvedIdempotencyOptions,
  context: ExecutionContext,
  routeName: string,
  logger: Logger,
): Promise<string> {
  let tenant: string | null | undefined;
  try {
    tenant = await options.tenant(context);
  } catch (error) {
    if (error instanceof HttpException) throw error;
    logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
    throw problems.tenantUnresolved();
  }
  if (typeof tenant !== 'string' || tenant === '') {
    logger.error(messages.log.tenantUnresolved(routeName));
    throw problems.tenantUnresolved();
  }
  return tenant;
}

/** The module's own answer to an outcome of the engine, or undefined when the error is the application's. */
export function problemForOutcome(
  error: unknown,
  options: ResolvedIdempotencyOptions,
  routeName: string,
  key: string,
  logger: Logger,
): IdempotencyProblemException | undefined {
  if (error instanceof IdempotencyProblemException) return error;
  if (error instanceof KeyInFlightError) return problems.conflict(error.retryAfterSeconds);
  if (error instanceof FingerprintMismatchError) return problems.mismatch();
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
    return problems.unavailable(error.retryAfterSeconds ?? options.unavailableRetryAfter, error.cause, error.outcome);
  }
  return undefined;
}

/**
 * What identifies one execution of an idempotent route for the engine: the
 * key in its tenant, the fingerprint, and the route's resolved options.
 */
export function routeScope(
  route: RouteSettings,
  identity: { tenant: string; key: string; fingerprint: string },
  onFailure: WorkScope['onFailure'],
): WorkScope {
  const { leaseMs, ttlMs, waitMs, heartbeat, claimMode } = route.options;
  return { ...identity, leaseMs, ttlMs, waitMs, heartbeat, claimMode, label: route.name, onFailure };
}
