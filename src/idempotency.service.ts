import { Inject, Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import type { FailureDecision } from './core/outcomes.js';
import type { WorkScope } from './core/work.js';
import type { Phases } from './core/phases.js';
import { fingerprintValue } from './core/fingerprint-value.js';
import { tenantOrKeyError } from './core/tenant-or-key-error.js';
import { IDEMPOTENCY_OPTIONS } from './idempotency.constants.js';
import { type FailurePolicy, type ResolvedIdempotencyOptions, type Duration } from './idempotency.options.js';
import { resolveRouteOptions } from './resolve-options.js';
import type { ClaimMode, IdempotencyStore, StoredResponse, SweepOptions, SweepResult } from './core/idempotency-store.js';
import { executePhased } from './transports/phased-execution.js';
import { IdempotencyRuntime } from './transports/run-idempotent.js';
import { jsonResponse, readJson } from './transports/stored-outcome.js';

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

/**
 * The engine for callers outside HTTP (message consumers written by hand,
 * cron jobs): `execute` and `executePhased`, and the sweep for people who
 * schedule it themselves.
 */
@Injectable()
export class IdempotencyService {
  constructor(
    private readonly runtime: IdempotencyRuntime,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  /** The store keys live in. */
  get store(): IdempotencyStore<EntityManager> {
    return this.runtime.store;
  }

  /**
   * Tells this process that the lease of its attempt on `(tenant, key)` was
   * ended in the store (the operator board's release does, after its UPDATE),
   * so duplicates arriving here are not answered 409 from memory. Other
   * processes notice through the store at once, and this one would at its
   * next heartbeat anyway.
   */
  leaseEnded(tenant: string, key: string): void {
    this.runtime.engine.forgetLease(tenant, key);
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
    const context = this.runtime.newContext();
    const outcome = await this.runtime.engine.execute<T>({
      ...scope,
      run: (manager, claim, ended) =>
        this.runtime.inTransaction(context, scope, manager, claim, ended, async () => resultOf(await work(manager))),
    });
    return readJson<T>(outcome.response, null as T);
  }

  /**
   * `execute` for work written as atomic phases: each `phases.run(name, fn)`
   * commits on its own with a recovery point, and a later call that takes the
   * key over (after a crash, once the lease ends) resumes after the last
   * recorded phase. See `Phases`.
   */
  async executePhased<T>(input: ExecuteInput, work: (phases: Phases<EntityManager>) => T | Promise<T>): Promise<T> {
    const scope = this.scopeOf(input);
    const outcome = await executePhased<T>(this.runtime, scope, this.runtime.newContext(), async (_claim, phases) =>
      resultOf(await work(phases)),
    );
    return readJson<T>(outcome.response, null as T);
  }

  /** Deletes expired keys now, in bounded batches; for people who schedule it themselves. */
  sweep(options?: Partial<SweepOptions>): Promise<SweepResult> {
    const { batchSize, maxDurationMs, dutyCycle } = this.options.sweep;
    return this.store.sweep({ batchSize, maxDurationMs, dutyCycle, ...options });
  }

  /**
   * The work's scope, from the call's options over the module's. A tenant or
   * key the store could not hold as it is (a Buffer, an empty string, a lone
   * surrogate, a NUL) is refused here, before anything is claimed.
   */
  private scopeOf(input: ExecuteInput): WorkScope {
    const refused = tenantOrKeyError(input.tenant, input.key);
    if (refused) throw refused;
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
      replayFromMemory: route.replayFromMemory,
      label: input.label ?? 'execute',
      onFailure: (): FailureDecision => ({ action: route.onError === 'release' ? 'release' : 'keep' }),
    };
  }
}

/** Results of non-HTTP work are stored as JSON, and every call returns them as read back from it. */
function resultOf<T>(value: T): { response: StoredResponse; result: T } {
  const response = jsonResponse(value ?? null, 200);
  return { response, result: readJson<T>(response, null as T) };
}
