import { Inject, Injectable } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { healthMessages } from './messages.js';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { Outbox } from '../outbox/outbox.js';
import { IdempotencyStore } from '../core/idempotency-store.js';
import { IdempotencySweeper } from '../sweeper/idempotency.sweeper.js';
import { PostgresIdempotencyStore } from '../store/postgres/postgres-idempotency.store.js';
import type { PartitionStatus } from '../store/partitioned/partition-retention.js';

/**
 * The tenant of the health check's probe claims. Reserved: an application's
 * tenant resolver should never return it.
 */
export const HEALTH_PROBE_TENANT = 'nest-idempotency:health';

/** A probe claim released at once; if the release is lost, its lease and TTL end it soon and the sweeper deletes it. */
const PROBE_LEASE_MS = 5_000;
const PROBE_TTL_MS = 60_000;

export type IdempotencyHealthStatus = 'up' | 'degraded' | 'down';

export interface IdempotencyHealthOptions {
  /** Longest wait for the store's answers, in milliseconds; past it the store counts as down. Default 1000. */
  timeout?: number;
  /** Expired keys counted at most; a backlog that reaches it makes the result degraded. Default 10 000. */
  maxExpiredBacklog?: number;
  /** Dead-lettered outbox messages tolerated before the result is degraded. Default 0. */
  maxDeadLetters?: number;
  /**
   * Partitioned key table: partitions that hold nothing live but are still
   * attached, tolerated before the result is degraded. Default 1 (one may be
   * waiting for the next sweeper run).
   */
  maxRetirablePartitions?: number;
}

/** The key store, checked through the claim path: a probe claim, then its release. */
export type StoreHealth = { status: 'up' | 'down'; responseTimeMs: number; message?: string };

/** The sweeper of this process, and the expired keys waiting in the table. */
export type SweeperHealth = {
  status: 'up' | 'degraded';
  scheduled: boolean;
  /** The last run in this process (`IdempotencySweeper.lastRun`), if any. */
  lastRun: { finishedAt: string; ran: boolean; deleted: number; failed: boolean } | null;
  /** Expired keys counted, at most `maxExpiredBacklog`; absent when the store cannot count them or did not answer. */
  expiredBacklog?: number;
  message?: string;
};

/**
 * The partitioned key table's partitions; reported when the `partitioned`
 * option is given. Degraded when upkeep falls behind (less than one partition
 * ahead of now, or keys in the default partition) or retirement does
 * (partitions with nothing live still attached).
 */
export type PartitionsHealth = {
  status: 'up' | 'degraded';
  /** Absent when the status did not answer. */
  partitions?: PartitionStatus;
  message?: string;
};

/** The outbox's dead letters; reported when the `outbox` option is given. */
export type OutboxHealth = {
  status: 'up' | 'degraded';
  /** Dead-lettered messages counted, at most `maxDeadLetters + 1000`; absent when the count did not answer. */
  deadLetters?: number;
  message?: string;
};

export type IdempotencyHealthReport = {
  /** `down` when the store fails the probe; `degraded` when it works but the sweeper or outbox needs attention. */
  status: IdempotencyHealthStatus;
  store: StoreHealth;
  sweeper: SweeperHealth;
  partitions?: PartitionsHealth;
  outbox?: OutboxHealth;
};

/** What `isHealthy(key)` resolves to: a Terminus `HealthIndicatorResult`. */
export type IdempotencyHealthResult<Key extends string = string> = Record<
  Key,
  { status: IdempotencyHealthStatus } & Omit<IdempotencyHealthReport, 'status'>
>;

/** The part of `@nestjs/terminus` this uses; an optional peer, loaded by `isHealthy()`. */
interface HealthIndicators {
  check(key: string): Record<IdempotencyHealthStatus, (data: object) => Record<string, unknown>>;
}

/**
 * A Terminus health indicator for the module: checks the key store through
 * the claim path (a probe claim in a reserved tenant, released at once, so
 * the key table, its claim function, the pool and the permissions all
 * answer), the sweeper's last run and its backlog of expired keys, and the
 * outbox's dead letters.
 *
 * The store failing the probe is `down` (503 from Terminus). A sweeper that
 * is overdue or failing, a large backlog, or dead letters are `degraded`
 * (still 200): requests are served correctly meanwhile.
 *
 * ```ts
 * @Get('health') @HealthCheck()
 * check() { return this.health.check([() => this.idempotency.isHealthy('idempotency')]); }
 * ```
 */
@Injectable()
export class IdempotencyHealthIndicator {
  private readonly probeKey = `probe:${randomUUID()}`;
  private readonly startedAt = Date.now();
  private indicators?: HealthIndicators;

  constructor(
    private readonly store: IdempotencyStore,
    private readonly sweeper: IdempotencySweeper,
    private readonly outbox: Outbox,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly moduleRef: ModuleRef,
  ) {}

  /** The check as a Terminus result under `key`. Needs `@nestjs/terminus`. */
  async isHealthy<const Key extends string = 'idempotency'>(
    key: Key = 'idempotency' as Key,
    options: IdempotencyHealthOptions = {},
  ): Promise<IdempotencyHealthResult<Key>> {
    const indicators = await this.healthIndicators();
    const { status, ...details } = await this.report(options);
    return indicators.check(key)[status](details) as IdempotencyHealthResult<Key>;
  }

  /** The check as a plain report, without Terminus. */
  async report(options: IdempotencyHealthOptions = {}): Promise<IdempotencyHealthReport> {
    const timeoutMs = options.timeout ?? 1_000;
    const maxBacklog = options.maxExpiredBacklog ?? 10_000;
    const maxDead = options.maxDeadLetters ?? 0;
    const deadLimit = maxDead + 1_000;
    const partitioned = this.store instanceof PostgresIdempotencyStore && this.store.partitioned ? this.store : undefined;
    const [store, backlog, dead, layout] = await Promise.all([
      this.probeStore(timeoutMs),
      this.store.countExpired ? settle(this.store.countExpired(maxBacklog), timeoutMs) : undefined,
      this.options.outbox.configured ? settle(this.outbox.store.countDead(deadLimit), timeoutMs) : undefined,
      partitioned ? settle(partitioned.partitionStatus(maxBacklog), timeoutMs) : undefined,
    ]);

    const sweeper = this.sweeperHealth(backlog, maxBacklog);
    const outbox = dead === undefined ? undefined : outboxHealth(dead, maxDead, deadLimit);
    const partitions =
      layout === undefined ? undefined : partitionsHealth(layout, maxBacklog, options.maxRetirablePartitions ?? 1);
    const degraded = [sweeper, outbox, partitions].some((part) => part?.status === 'degraded');
    const status: IdempotencyHealthStatus = store.status === 'down' ? 'down' : degraded ? 'degraded' : 'up';
    return { status, store, sweeper, ...(partitions ? { partitions } : {}), ...(outbox ? { outbox } : {}) };
  }

  /** A claim of this process's probe key, then its release: the path every idempotent request takes first. */
  private async probeStore(timeoutMs: number): Promise<StoreHealth> {
    const started = performance.now();
    const ref = { tenant: HEALTH_PROBE_TENANT, key: this.probeKey, ownerToken: randomUUID() };
    const probe = (async () => {
      const claim = await this.store.claim({ ...ref, fingerprint: 'health-probe', leaseMs: PROBE_LEASE_MS, ttlMs: PROBE_TTL_MS });
      // Any answer proves the path; only a claim of ours is ours to give back. (In flight: a probe whose release was lost.)
      if (claim.state === 'claimed') await this.store.release(ref);
    })();
    const outcome = await settle(probe, timeoutMs);
    const responseTimeMs = Math.round(performance.now() - started);
    return outcome.ok ? { status: 'up', responseTimeMs } : { status: 'down', responseTimeMs, message: outcome.message };
  }

  private sweeperHealth(backlog: Settled<number> | undefined, maxBacklog: number): SweeperHealth {
    const sweep = this.options.sweep;
    const last = this.sweeper.lastRun;
    const problems: string[] = [];
    if (last?.error !== undefined) problems.push(healthMessages.sweeperFailed(reasonOf(last.error)));
    if (sweep.scheduled) {
      // One missed tick of slack, plus a run's whole time budget.
      const sinceMs = Date.now() - (last?.finishedAt.getTime() ?? this.startedAt);
      if (sinceMs > 2 * sweep.intervalMs + sweep.maxDurationMs) problems.push(healthMessages.sweeperOverdue(sinceMs));
    }
    if (backlog?.ok && backlog.value >= maxBacklog) problems.push(healthMessages.backlog(maxBacklog));
    if (backlog && !backlog.ok) problems.push(backlog.message);
    return {
      status: problems.length > 0 ? 'degraded' : 'up',
      scheduled: sweep.scheduled,
      lastRun: last
        ? { finishedAt: last.finishedAt.toISOString(), ran: last.ran, deleted: last.deleted, failed: last.error !== undefined }
        : null,
      ...(backlog?.ok ? { expiredBacklog: backlog.value } : {}),
      ...(problems.length > 0 ? { message: problems.join(' ') } : {}),
    };
  }

  private async healthIndicators(): Promise<HealthIndicators> {
    if (this.indicators) return this.indicators;
    let terminus: typeof import('@nestjs/terminus');
    try {
      terminus = await import('@nestjs/terminus');
    } catch {
      throw new IdempotencyConfigurationError(healthMessages.terminusMissing);
    }
    let indicators: HealthIndicators;
    try {
      // The app's own instance when TerminusModule is imported anywhere, as every other indicator uses.
      indicators = this.moduleRef.get(terminus.HealthIndicatorService, { strict: false });
    } catch {
      indicators = new terminus.HealthIndicatorService();
    }
    return (this.indicators = indicators);
  }
}

function partitionsHealth(
  settled: Settled<PartitionStatus | undefined>,
  defaultRowsLimit: number,
  maxRetirable: number,
): PartitionsHealth {
  if (!settled.ok) return { status: 'degraded', message: settled.message };
  const partitions = settled.value!;
  const problems: string[] = [];
  const { aheadMs, intervalMs } = partitions;
  if (!partitions.coversNow || aheadMs === null || (intervalMs !== null && aheadMs < intervalMs)) {
    problems.push(healthMessages.partitionsAhead(partitions.coversNow ? (aheadMs ?? 0) : 0, intervalMs ?? 0));
  }
  if (partitions.defaultRows > 0) {
    problems.push(healthMessages.defaultPartitionRows(partitions.defaultRows, partitions.defaultRows >= defaultRowsLimit));
  }
  if (partitions.retirable > maxRetirable) problems.push(healthMessages.partitionsOverdue(partitions.retirable));
  return {
    status: problems.length > 0 ? 'degraded' : 'up',
    partitions,
    ...(problems.length > 0 ? { message: problems.join(' ') } : {}),
  };
}

function outboxHealth(dead: Settled<number>, maxDead: number, limit: number): OutboxHealth {
  if (!dead.ok) return { status: 'degraded', message: dead.message };
  if (dead.value <= maxDead) return { status: 'up', deadLetters: dead.value };
  return { status: 'degraded', deadLetters: dead.value, message: healthMessages.deadLetters(dead.value, dead.value >= limit) };
}

type Settled<T> = { ok: true; value: T } | { ok: false; message: string };

/** Waits for `promise` at most `timeoutMs`. A late promise runs on; its outcome is dropped. */
async function settle<T>(promise: Promise<T>, timeoutMs: number): Promise<Settled<T>> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<Settled<T>>((resolve) => {
    timer = setTimeout(() => resolve({ ok: false, message: healthMessages.timedOut(timeoutMs) }), timeoutMs);
  });
  const outcome = promise.then(
    (value): Settled<T> => ({ ok: true, value }),
    (error: unknown): Settled<T> => ({ ok: false, message: reasonOf(error) }),
  );
  try {
    return await Promise.race([outcome, timedOut]);
  } finally {
    clearTimeout(timer);
  }
}

const reasonOf = (error: unknown) => (error instanceof Error ? error.message : String(error));
