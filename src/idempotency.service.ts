import { Inject, Injectable, Optional } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import {
  IdempotencyEngine,
  workOf,
  type ClaimInfo,
  type WorkScope,
  type ClaimMode,
  type EngineOutcome,
  type FailureDecision,
  type IdempotentWork,
  type PhasedWork,
} from './core/idempotency-engine.js';
import type { Phases } from './core/phases.js';
import { fingerprintValue } from './core/fingerprint.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OBSERVER, IDEMPOTENCY_OPTIONS } from './idempotency.constants.js';
import type { EngineObserver } from './core/observer.js';
import { type FailurePolicy, type ResolvedIdempotencyOptions, type Duration } from './idempotency.options.js';
import { resolveRouteOptions } from './resolve-options.js';
import { IdempotencyStore, type StoredResponse, type SweepOptions, type SweepResult } from './core/idempotency-store.js';
import { idempotencyContext, type IdempotencyExecutionContext } from './transaction/idempotency-context.js';
import {
  IDEMPOTENCY_TRANSACTION_MANAGER,
  type AppTransactionManager,
  type TransactionOutcome,
} from './transaction/app-transaction-manager.js';
import { StoreUnavailableError } from './core/errors.js';
import { tenantOrKeyError } from './core/key.js';

/** A unit of non-HTTP work to run at most once per key (a message, a job). */
export interface ExecuteInput {
  /** Scope of the key; never shared between tenants. A non-empty string of well-formed Unicode without NUL. */
  tenant: string;
  /** The idempotency key, e.g. a message id or `order-1042:capture`; the same rules as `tenant`. */
  key: string;
  /** What identifies the work; a different payload under the same key is a mismatch. */
  payload: unknown;
  /** Overrides the module's TTL for this key. */
  ttl?: Duration;
  /** Overrides the module's lease for this key. */
  lease?: Duration;
  /** What to do with the key if `work` throws: default the module's `onError` (`'keep'`). `'store'` is not available here. */
  onError?: Exclude<FailurePolicy, 'store'>;
  /** Wait this long for a call in flight with the same key, then return its result, instead of `KeyInFlightError`. */
  wait?: Duration;
  /** See the module option `claimMode`. `executePhased` always claims separately. */
  claimMode?: ClaimMode;
  /** Renew the lease while `work` runs. Default the module's `heartbeat` (`true`). */
  heartbeat?: boolean;
  /** Names this kind of work in spans, metrics and events (e.g. `'refund-consumer'`); never put a key in it. Default `'execute'`. */
  label?: string;
}

const JSON_HEADERS: Array<[string, string]> = [['content-type', 'application/json']];

/** Results of non-HTTP work are stored as JSON, and read back from it on every call. */
function encodeResult<T>(value: T): { response: StoredResponse; result: T } {
  const json = JSON.stringify(value ?? null);
  return { response: { status: 200, headers: JSON_HEADERS, body: Buffer.from(json, 'utf8') }, result: JSON.parse(json) as T };
}

function decodeResult<T>(response: StoredResponse): T {
  return JSON.parse((response.body ?? Buffer.from('null')).toString('utf8')) as T;
}

/**
 * The engine for callers outside HTTP (message consumers, cron jobs), and the
 * shared entry the interceptor uses.
 */
@Injectable()
export class IdempotencyService {
  private readonly engine: IdempotencyEngine<EntityManager>;

  constructor(
    readonly store: IdempotencyStore<EntityManager>,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Optional() @Inject(IDEMPOTENCY_OBSERVER) observer?: EngineObserver,
    @Optional() @Inject(IDEMPOTENCY_TRANSACTION_MANAGER) private readonly appTransactions?: AppTransactionManager,
  ) {
    this.engine = new IdempotencyEngine(store, observer);
  }

  /**
   * Tells this process that the lease of its attempt on `(tenant, key)` was
   * ended in the store (the operator board's release does, after its UPDATE),
   * so duplicates arriving here are not answered 409 from memory. Other
   * processes notice through the store at once, and this one would at its
   * next heartbeat anyway.
   */
  leaseEnded(tenant: string, key: string): void {
    this.engine.forgetLease(tenant, key);
  }

  /**
   * Runs `work` at most once for `(tenant, key)`, with the same guarantees as
   * an `@Idempotent()` route: the claim commits alone, `work`'s writes through
   * the given manager (or `TransactionHost`) commit with the completion marker,
   * and a later call with the same key and payload returns the stored result
   * without running `work`.
   *
   * The result is stored as JSON, and every call, first or replayed, returns
   * it as parsed back from that JSON, so callers see one shape either way.
   *
   * @throws KeyInFlightError another call holds the key (retry later)
   * @throws FingerprintMismatchError the key was used with another payload
   * @throws LeaseLostError this call outran its lease and was rolled back
   * @throws StoreUnavailableError the database cannot be reached
   * @throws IdempotencyInputError the tenant or key is not a non-empty string of well-formed Unicode without NUL
   */
  async execute<T>(input: ExecuteInput, work: (manager: EntityManager) => T | Promise<T>): Promise<T> {
    const scope = this.scopeOf(input);
    const outcome = await this.run(workOf(scope, async (manager: EntityManager) => encodeResult(await work(manager))));
    return decodeResult<T>(outcome.response);
  }

  /**
   * `execute` for work written as atomic phases: each `phases.run(name, fn)`
   * commits on its own with a recovery point, and a later call that takes the
   * key over (after a crash, once the lease ends) resumes after the last
   * recorded phase. See `Phases`.
   */
  async executePhased<T>(input: ExecuteInput, work: (phases: Phases<EntityManager>) => T | Promise<T>): Promise<T> {
    const scope = this.scopeOf(input);
    const outcome = await this.runPhased(
      workOf(scope, async (phases: Phases<EntityManager>) => encodeResult(await work(phases))),
    );
    return decodeResult<T>(outcome.response);
  }

  private scopeOf(input: ExecuteInput): WorkScope {
    const route = resolveRouteOptions(
      {
        ttl: input.ttl,
        lease: input.lease,
        onError: input.onError,
        wait: input.wait,
        claimMode: input.claimMode,
        heartbeat: input.heartbeat,
      },
      this.options,
      'execute()',
    );
    return {
      tenant: input.tenant,
      key: input.key,
      fingerprint: fingerprintValue(input.payload),
      leaseMs: route.leaseMs,
      ttlMs: route.ttlMs,
      waitMs: route.waitMs,
      heartbeat: route.heartbeat,
      claimMode: route.claimMode,
      label: input.label ?? 'execute',
      onFailure: (): FailureDecision => ({ action: route.onError === 'release' ? 'release' : 'keep' }),
    };
  }

  /**
   * Runs one idempotent unit of work with the request context in
   * AsyncLocalStorage. `context` (optional) lets the caller see what the work
   * did, e.g. whether the route handler started.
   *
   * Every entry point and `execute()` come through here (or `runPhased`), so
   * this is where a tenant or key the store could not hold as it is (a
   * Buffer, an empty string, a lone surrogate, a NUL) is refused, before
   * anything is claimed.
   *
   * @throws IdempotencyInputError the tenant or key cannot be used
   */
  run<R>(
    work: IdempotentWork<EntityManager, R>,
    context: IdempotencyExecutionContext = this.createContext(),
  ): Promise<EngineOutcome<R>> {
    const refused = tenantOrKeyError(work.tenant, work.key);
    if (refused) return Promise.reject(refused);
    context.scope = { tenant: work.tenant, key: work.key };
    let ended: (outcome: TransactionOutcome) => void = () => undefined;
    const ending = new Promise<TransactionOutcome>((resolve) => (ended = resolve));
    const outcome = this.engine.execute(
      workOf(work, (manager: EntityManager, claim: ClaimInfo) => {
        context.scope = { tenant: work.tenant, key: work.key, generation: claim.generation };
        context.manager = manager;
        context.transactional = true;
        return idempotencyContext.run(context, () => this.joined(manager, () => work.run(manager, claim), ending));
      }),
    );
    // Once the engine is done, the work's transaction has ended: committed only when it executed.
    outcome.then(
      (done) => ended(done.kind === 'executed' ? 'committed' : 'rolled-back'),
      (error: unknown) =>
        ended(error instanceof StoreUnavailableError && error.outcome === 'unknown' ? 'unknown' : 'rolled-back'),
    );
    return outcome;
  }

  /** Runs `work` with the app's own transaction manager (if any) joined to the module's transaction. */
  private joined<T>(manager: EntityManager, work: () => Promise<T>, ended: Promise<TransactionOutcome>): Promise<T> {
    return this.appTransactions ? this.appTransactions.join(manager, work, ended) : work();
  }

  /** `run` for phased work: no transaction around the work, one per phase, each visible through `TransactionHost`. */
  runPhased<R>(
    work: PhasedWork<EntityManager, R>,
    context: IdempotencyExecutionContext = this.createContext(),
  ): Promise<EngineOutcome<R>> {
    const refused = tenantOrKeyError(work.tenant, work.key);
    if (refused) return Promise.reject(refused);
    context.scope = { tenant: work.tenant, key: work.key };
    const phased: PhasedWork<EntityManager, R> = workOf(work, (phases: Phases<EntityManager>, claim: ClaimInfo) => {
      context.phases = phases;
      context.scope = { tenant: work.tenant, key: work.key, generation: claim.generation };
      return idempotencyContext.run(context, () => work.run(phases, claim));
    });
    phased.enterPhase = (manager, fn, ended) =>
      idempotencyContext.run({ ...context, manager, transactional: true }, () => this.joined(manager, fn, ended));
    return this.engine.executePhased(phased);
  }

  /** A fresh execution context: the plain manager until a transaction opens, the handler not started. */
  createContext(): IdempotencyExecutionContext {
    return { manager: this.dataSource.manager, transactional: false, handlerStarted: false };
  }

  /** Runs `fn` with the data source's plain manager as the request context (a route without a key). */
  runWithoutIdempotency<T>(fn: () => T): T {
    return idempotencyContext.run(this.createContext(), fn);
  }

  /** Deletes expired keys now, in bounded batches; for people who schedule it themselves. */
  sweep(options?: Partial<SweepOptions>): Promise<SweepResult> {
    const { batchSize, maxDurationMs, dutyCycle } = this.options.sweep;
    return this.store.sweep({ batchSize, maxDurationMs, dutyCycle, ...options });
  }
}
