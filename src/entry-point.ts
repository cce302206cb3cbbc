import { HttpException, Logger, type ExecutionContext } from '@nestjs/common';
import {
  CommitRefusedError,
  FingerprintMismatchError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './core/errors.js';
import { redactKey, unusableIdentifier } from './core/key.js';
import { messages } from './errors/messages.js';
import { IdempotencyProblemException, problems } from './errors/problems.js';
import { workOf, type ClaimInfo, type EngineOutcome, type FailureDecision, type WorkScope } from './core/idempotency-engine.js';
import type { StoredResponse } from './core/idempotency-store.js';
import { fingerprintValue } from './core/fingerprint.js';
import type { RouteSettings } from './http/route-settings.js';
import type { FailurePolicy, ResolvedIdempotencyOptions } from './idempotency.options.js';
import type { IdempotencyService } from './idempotency.service.js';

/*
 * What every entry point (HTTP routes, GraphQL mutations, message handlers)
 * does alike around the engine: find the tenant, and turn the engine's own
 * outcomes into the module's problems.
 */

/**
 * The tenant of a request, or a problem 500 that fails it closed (logged):
 * there is no shared scope to fall back on, and a tenant the store could not
 * hold as it is (an empty string, a Buffer, a lone surrogate, a NUL) is no
 * tenant either. An `HttpException` from the resolver (a 401 for a missing
 * principal) is the resolver's answer and goes out as it is.
 */
export async function resolveTenant(
  options: ResolvedIdempotencyOptions,
  context: ExecutionContext,
  routeName: string,
  logger: Logger,
): Promise<string> {
  let tenant: unknown;
  try {
    tenant = await options.tenant(context);
  } catch (error) {
    if (error instanceof HttpException) throw error;
    logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
    throw problems.tenantUnresolved();
  }
  if (tenant === undefined || tenant === null) {
    logger.error(messages.log.tenantUnresolved(routeName));
    throw problems.tenantUnresolved();
  }
  const unusable = unusableIdentifier(tenant);
  if (unusable) {
    logger.error(messages.log.tenantUnusable(routeName, unusable));
    throw problems.tenantUnresolved();
  }
  return tenant as string;
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
  const maxHoldMs = route.options.maxHoldMs ?? leaseMs * 10;
  // Field by field rather than spread: see `workOf`.
  return {
    tenant: identity.tenant,
    key: identity.key,
    fingerprint: identity.fingerprint,
    leaseMs,
    ttlMs,
    waitMs,
    heartbeat,
    claimMode,
    maxHoldMs,
    label: route.name,
    onFailure,
    onHoldExceeded: () => holdLogger.warn(messages.log.holdExceeded(route.name, maxHoldMs)),
  };
}

const holdLogger = new Logger('Idempotency');

/** How an entry point reads a failure of the handler's body, for the route's failure policies. */
export type FailureReading =
  /** `definite`: the handler's own answer (an HTTP 4xx, a GraphQL or RPC error): `onHttpException` applies, else `onError`. */
  | { definite: boolean; response: () => Promise<StoredResponse | null> }
  /** A decision the entry point makes itself (e.g. a response that cannot be stored). */
  | FailureDecision;

/** What one entry point supplies to run an idempotent handler; everything else is the same for HTTP, GraphQL and messages. */
export interface HandlerRun<R> {
  route: RouteSettings;
  context: ExecutionContext;
  tenant: string;
  key: string;
  /** The request's fingerprint when the route sets no `fingerprint` of its own. */
  defaultFingerprint: () => string;
  /** Runs the handler and says what to store. */
  run: (claim: ClaimInfo) => Promise<{ response: StoredResponse; result: R }>;
  /** Reads a failure of the handler (the engine calls it once its writes rolled back). */
  readFailure: (error: unknown) => FailureReading | Promise<FailureReading>;
  /** Told which policy decided a failure: `'rejected'` when the handler's body never started. */
  decided?: (policy: FailurePolicy | 'rejected') => void;
}

/**
 * The one path every entry point drives the engine through: the
 * fingerprint (the route's own, or the transport's default), the execution
 * context that tells whether the handler's body started, the failure
 * policies, and phases or one transaction.
 *
 * @throws UnrepresentableInputError the fingerprint's input has no canonical form (nothing claimed)
 */
export function runHandler<R>(service: IdempotencyService, h: HandlerRun<R>): Promise<EngineOutcome<R>> {
  const { route } = h;
  const fingerprint = route.options.fingerprint ? fingerprintValue(route.options.fingerprint(h.context)) : h.defaultFingerprint();
  const execution = service.createContext();
  const onFailure = async (error: unknown): Promise<FailureDecision> => {
    const reading = await h.readFailure(error);
    if ('action' in reading) return reading;
    // A pipe or guard refused the request before the handler's body ran: nothing took effect.
    if (!execution.handlerStarted && !(error instanceof CommitRefusedError)) {
      h.decided?.('rejected');
      return { action: 'release' };
    }
    const policy = reading.definite ? route.options.onHttpException : route.options.onError;
    h.decided?.(policy);
    if (policy !== 'store') return { action: policy };
    const response = await reading.response();
    return response ? { action: 'store', response } : { action: 'keep' };
  };
  const scope = routeScope(route, { tenant: h.tenant, key: h.key, fingerprint }, onFailure);
  // The handler runs the same whatever the engine hands it: one transaction's manager, or the phases.
  const work = workOf(scope, (_txOrPhases: unknown, claim: ClaimInfo) => h.run(claim));
  return route.options.phases ? service.runPhased(work, execution) : service.run(work, execution);
}

const JSON_HEADERS: Array<[string, string]> = [['content-type', 'application/json']];

/** What a GraphQL mutation's or a message handler's outcome is stored as: its value, or a definite error to replay. */
export type StoredOutcome<E = unknown> = { value: unknown } | { error: E };

export function encodeOutcome(outcome: StoredOutcome, status: number): StoredResponse {
  return { status, headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(outcome), 'utf8') };
}

export function decodeOutcome<E = unknown>(response: StoredResponse): StoredOutcome<E> {
  return JSON.parse((response.body ?? Buffer.from('{"value":null}')).toString('utf8')) as StoredOutcome<E>;
}
