import { HttpException, Inject, Injectable, Logger, Optional, type CallHandler, type ExecutionContext } from '@nestjs/common';
import type { Subscriber } from 'rxjs';
import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../store/connection.js';
import { asWorkManager } from '../store/work-manager.js';
import { CompletedAnswers } from '../core/completed-answers.js';
import { IdempotencyEngine } from '../core/idempotency-engine.js';
import { IdempotencyStore, type StoredResponse } from '../core/idempotency-store.js';
import { fingerprintValue } from '../core/fingerprint.js';
import { unusableIdentifier } from '../core/key.js';
import type { EngineObserver } from '../core/observer.js';
import { decideFailure, type FailurePolicy, type FailureReading } from '../core/outcomes.js';
import type { Phases, TransactionOutcome } from '../core/phases.js';
import type { ClaimInfo, EngineOutcome, IdempotentWork, PhasedWork, WorkScope } from '../core/work.js';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';
import type { RouteSettings } from '../http/route-settings.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OBSERVER, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IDEMPOTENCY_TRANSACTION_MANAGER, type AppTransactionManager } from '../transaction/app-transaction-manager.js';
import { idempotencyContext, type IdempotencyExecutionContext } from '../transaction/idempotency-context.js';

/** What the handler's run gives the engine: the response to store, and the value to pass on. */
export type Done<R> = { response: StoredResponse; result: R };

/**
 * One request of one transport (HTTP, GraphQL, messages): what it supplies
 * to `runIdempotent`, which does everything else the same for all three.
 * Built from the app's runtime, the route, Nest's context and handler, and
 * the subscriber of the Observable Nest asked for.
 */
export abstract class NestTransport<R = unknown> {
  constructor(
    protected readonly runtime: IdempotencyRuntime,
    protected readonly route: RouteSettings,
    protected readonly context: ExecutionContext,
    protected readonly next: CallHandler,
    protected readonly subscriber: Subscriber<unknown>,
  ) {}

  /** The request's key, or undefined when it carries none. Throws when the key is malformed. */
  abstract readKey(): string | undefined;
  /** The fingerprint of the request when the route sets no `fingerprint` of its own. */
  abstract fingerprint(): string;
  /** Runs the handler once the key is claimed. */
  abstract invoke(claim: ClaimInfo): Promise<Done<R>>;
  /** Reads a failure of the handler, once its writes rolled back. */
  abstract readFailure(error: unknown): FailureReading | Promise<FailureReading>;
  /** Told which policy decided a failure (`'rejected'`: the handler's body never started). */
  decided?(policy: FailurePolicy | 'rejected'): void;
  /** Runs the handler with no idempotency: a route whose key is optional, called without one. */
  abstract runWithoutKey(): void;
  /** Sends the outcome on: the handler's result, a replay, or a stored failure. */
  abstract answer(outcome: EngineOutcome<R>): void | Promise<void>;
  /** Answers an error of the engine (409, 422, 503, ...), or the app's own. */
  abstract fail(error: unknown, key: string): void | Promise<void>;

  /**
   * Answers a request refused before anything was claimed, at `step`: as any
   * other error of the module (a problem), unless the transport answers
   * refusals its own way (a message is dead-lettered).
   */
  refuse(error: unknown, _step: 'key' | 'tenant' | 'fingerprint'): void | Promise<void> {
    return this.fail(error, '');
  }

  /** Something the path did not expect (a bug): the error goes on to the app's filters, which log and answer it. */
  unexpected(error: unknown): void {
    this.subscriber.error(error);
  }
}

/**
 * The one request path of every transport, top to bottom: the key, the
 * tenant, the fingerprint, the engine (with the request context the handler
 * sees through `TransactionHost`), and the answer.
 */
export async function runIdempotent<R>(
  runtime: IdempotencyRuntime,
  route: RouteSettings,
  context: ExecutionContext,
  transport: NestTransport<R>,
): Promise<void> {
  let key: string | undefined;
  let tenant: string;
  let fingerprint: string;
  let step: 'key' | 'tenant' | 'fingerprint' = 'key';
  try {
    key = transport.readKey();
    if (key === undefined) {
      if (!route.options.required) return transport.runWithoutKey();
      throw problems.missingKey(runtime.options.header);
    }
    step = 'tenant';
    const resolved = runtime.tenantOf(context, route.name);
    tenant = typeof resolved === 'string' ? resolved : await resolved;
    step = 'fingerprint';
    fingerprint = route.options.fingerprint ? fingerprintValue(route.options.fingerprint(context)) : transport.fingerprint();
  } catch (error) {
    return transport.refuse(error, step);
  }

  const { leaseMs, ttlMs, waitMs, heartbeat, claimMode, phases } = route.options;
  const maxHoldMs = route.options.maxHoldMs ?? leaseMs * 10;
  const execution = runtime.newContext();
  // The work, built once: the route's scope, and the handler run in the request context.
  const work: IdempotentWork<EntityManager, R> = {
    tenant,
    key,
    fingerprint,
    leaseMs,
    ttlMs,
    waitMs,
    heartbeat,
    claimMode,
    maxHoldMs,
    replayFromMemory: route.options.replayFromMemory,
    label: route.name,
    onFailure: async (error) =>
      decideFailure(error, await transport.readFailure(error), execution.handlerStarted, route.options, (policy) =>
        transport.decided?.(policy),
      ),
    onHoldExceeded: () => runtime.logger.warn(messages.log.holdExceeded(route.name, maxHoldMs)),
    run: (manager, claim, ended) => runtime.inTransaction(execution, work, manager, claim, ended, () => transport.invoke(claim)),
  };
  try {
    const outcome = phases
      ? await runtime.executePhased(work, execution, (claim) => transport.invoke(claim))
      : await runtime.engine.execute(work);
    await transport.answer(outcome);
  } catch (error) {
    await transport.fail(error, key);
  }
}

/**
 * What every idempotent execution of the app shares: the options, the
 * engine over the store, and the request context the work runs in (the
 * transaction `TransactionHost` gives, joined to the app's own transaction
 * manager when there is one).
 */
@Injectable()
export class IdempotencyRuntime {
  readonly engine: IdempotencyEngine<EntityManager>;
  readonly logger = new Logger('Idempotency');

  constructor(
    readonly store: IdempotencyStore<EntityManager>,
    @Inject(IDEMPOTENCY_OPTIONS) readonly options: ResolvedIdempotencyOptions,
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: SourceDataSource,
    @Optional() @Inject(IDEMPOTENCY_OBSERVER) observer?: EngineObserver,
    @Optional() @Inject(IDEMPOTENCY_TRANSACTION_MANAGER) private readonly appTransactions?: AppTransactionManager,
  ) {
    this.engine = new IdempotencyEngine(store, observer, new CompletedAnswers(options.completedAnswers));
  }

  /** A fresh execution context: the plain manager until a transaction opens, the handler not started. */
  newContext(): IdempotencyExecutionContext {
    return { manager: asWorkManager(this.dataSource.manager), transactional: false, handlerStarted: false };
  }

  /** Runs `fn` with the data source's plain manager as the request context (a route without a key). */
  withoutIdempotency<T>(fn: () => T): T {
    return idempotencyContext.run(this.newContext(), fn);
  }

  /** Runs `body` as the work of `work` in its transaction: visible through `TransactionHost` and the app's manager. */
  inTransaction<T>(
    context: IdempotencyExecutionContext,
    work: WorkScope,
    manager: EntityManager,
    claim: ClaimInfo,
    ended: Promise<TransactionOutcome>,
    body: () => Promise<T>,
  ): Promise<T> {
    context.scope = { tenant: work.tenant, key: work.key, generation: claim.generation };
    context.manager = manager;
    context.transactional = true;
    return idempotencyContext.run(context, () =>
      this.appTransactions ? this.appTransactions.join(manager, body, ended) : body(),
    );
  }

  /** Runs `work` as phases: no transaction around it, one per phase, each visible through `TransactionHost`. */
  executePhased<R>(
    work: WorkScope,
    context: IdempotencyExecutionContext,
    body: (claim: ClaimInfo, phases: Phases<EntityManager>) => Promise<Done<R>>,
  ): Promise<EngineOutcome<R>> {
    const phased: PhasedWork<EntityManager, R> = {
      ...work,
      run: (phases, claim) => {
        context.phases = phases;
        context.scope = { tenant: work.tenant, key: work.key, generation: claim.generation };
        return idempotencyContext.run(context, () => body(claim, phases));
      },
      enterPhase: (manager, fn, ended) =>
        idempotencyContext.run({ ...context, manager, transactional: true }, () =>
          this.appTransactions ? this.appTransactions.join(manager, fn, ended) : fn(),
        ),
    };
    return this.engine.executePhased(phased);
  }

  /**
   * The tenant of a request, or a problem 500 that fails it closed (logged):
   * there is no shared scope to fall back on, and a tenant the store could not
   * hold as it is (an empty string, a Buffer, a lone surrogate, a NUL) is no
   * tenant either. An `HttpException` from the resolver (a 401 for a missing
   * principal) is the resolver's answer and goes out as it is. A resolver that
   * answers at once is answered at once (no promise per request).
   */
  tenantOf(context: ExecutionContext, routeName: string): string | Promise<string> {
    let tenant: unknown;
    try {
      tenant = this.options.tenant(context);
    } catch (error) {
      throw this.tenantFailed(error, routeName);
    }
    if (isThenable(tenant))
      return Promise.resolve(tenant).then(
        (resolved: unknown) => this.checkedTenant(resolved, routeName),
        (error: unknown) => {
          throw this.tenantFailed(error, routeName);
        },
      );
    return this.checkedTenant(tenant, routeName);
  }

  private tenantFailed(error: unknown, routeName: string): unknown {
    if (error instanceof HttpException) return error;
    this.logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
    return problems.tenantUnresolved();
  }

  private checkedTenant(tenant: unknown, routeName: string): string {
    if (tenant === undefined || tenant === null) {
      this.logger.error(messages.log.tenantUnresolved(routeName));
      throw problems.tenantUnresolved();
    }
    const unusable = unusableIdentifier(tenant);
    if (unusable) {
      this.logger.error(messages.log.tenantUnusable(routeName, unusable));
      throw problems.tenantUnresolved();
    }
    return tenant as string;
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}
