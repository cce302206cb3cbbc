import { Inject, Injectable, Logger, Optional, type ExecutionContext } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../store/connection.js';
import { asWorkManager } from '../store/work-manager.js';
import { CompletedAnswers } from '../core/completed-answers.js';
import { IdempotencyEngine } from '../core/idempotency-engine.js';
import { IdempotencyStore } from '../core/idempotency-store.js';
import { fingerprintValue } from '../core/fingerprint-value.js';
import { unusableIdentifier } from '../core/key.js';
import type { EngineObserver } from '../core/observer.js';
import { decideFailure } from '../core/outcomes.js';
import type { TransactionOutcome } from '../core/phases.js';
import type { ClaimInfo, IdempotentWork, WorkScope } from '../core/work.js';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';
import type { RouteSettings } from '../http/route-settings-type.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OBSERVER, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IDEMPOTENCY_TRANSACTION_MANAGER, type AppTransactionManager } from '../transaction/app-transaction-manager.js';
import { idempotencyContext, type IdempotencyExecutionContext } from '../transaction/idempotency-context.js';
import { executePhased } from './phased-execution.js';
import { tenantFailed, tenantLater, tenantRefused } from './tenant-failed.js';
import type { Transport } from './transport.js';

/**
 * The one request path of every transport: the key, the tenant, the fingerprint, the engine (with the request
 * context the handler sees through `TransactionHost`), and the answer.
 */
export async function runIdempotent<R>(
  runtime: IdempotencyRuntime,
  route: RouteSettings,
  context: ExecutionContext,
  transport: Transport<R>,
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
    return transport.refuse ? transport.refuse(error, step) : transport.fail(error, '');
  }
  const { leaseMs, ttlMs, waitMs, heartbeat, claimMode, phases } = route.options;
  const maxHoldMs = route.options.maxHoldMs ?? leaseMs * 10;
  const execution = runtime.newContext();
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
      ? await executePhased(runtime, work, execution, (claim) => transport.invoke(claim))
      : await runtime.engine.execute(work);
    await transport.answer(outcome);
  } catch (error) {
    await transport.fail(error, key);
  }
}

/**
 * What every idempotent execution shares: the options, the engine, and the request context the work runs in (the
 * transaction `TransactionHost` gives, joined to the app's own transaction manager when there is one).
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
    @Optional() @Inject(IDEMPOTENCY_TRANSACTION_MANAGER) readonly appTransactions?: AppTransactionManager,
  ) {
    this.engine = new IdempotencyEngine(store, observer, new CompletedAnswers(options.completedAnswers));
  }

  /** A fresh execution context: the plain manager until a transaction opens, the handler not started. */
  newContext(): IdempotencyExecutionContext {
    return { manager: asWorkManager(this.dataSource.manager), transactional: false, handlerStarted: false };
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

  /**
   * The request's tenant, or a logged problem 500 that fails it closed: no shared scope to fall back on. A tenant
   * the store cannot hold as it is (empty, a Buffer, a lone surrogate, a NUL) is none. A sync resolver gets no promise.
   */
  tenantOf(context: ExecutionContext, routeName: string): string | Promise<string> {
    let tenant: unknown;
    try {
      tenant = this.options.tenant(context);
    } catch (error) {
      throw tenantFailed(this.logger, error, routeName);
    }
    if (isThenable(tenant))
      return tenantLater(tenant, this.logger, routeName, (resolved) => this.checkedTenant(resolved, routeName));
    return this.checkedTenant(tenant, routeName);
  }

  private checkedTenant(tenant: unknown, routeName: string): string {
    const unusable = unusableIdentifier(tenant);
    if (unusable) throw tenantRefused(this.logger, routeName, tenant, unusable);
    return tenant as string;
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}
