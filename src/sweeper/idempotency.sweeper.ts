import { Inject, Injectable, Logger, Optional, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { EngineObserver } from '../core/observer.js';
import { IDEMPOTENCY_OBSERVER, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IdempotencyStore, type SweepResult } from '../core/idempotency-store.js';
import { scheduleInterval } from './scheduler-registry.js';
import { messages } from '../errors/messages.js';

/** What the last run of the sweeper in this process did. */
export interface SweepReport extends SweepResult {
  finishedAt: Date;
  error?: unknown;
}

/**
 * Deletes expired keys (on the partitioned table: retires whole partitions,
 * and keeps partitions made ahead) on a schedule registered at runtime with
 * `@nestjs/schedule`'s `SchedulerRegistry` (an optional peer: loaded only when
 * the sweeper is enabled). Correctness never depends on it: the claim treats
 * an expired key as absent whether or not it was swept.
 */
@Injectable()
export class IdempotencySweeper implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('IdempotencySweeper');
  private running?: Promise<SweepReport>;
  private stopSchedule?: () => void;
  /** The figures of the last finished run in this process, if any. */
  lastRun?: SweepReport;

  constructor(
    private readonly store: IdempotencyStore,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly moduleRef: ModuleRef,
    @Optional() @Inject(IDEMPOTENCY_OBSERVER) private readonly observer?: EngineObserver,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    const sweep = this.options.sweep;
    if (!sweep.scheduled) return;
    const name = `nest-idempotency:sweep:${this.options.tableName}`;
    this.stopSchedule = await scheduleInterval(this.moduleRef, name, sweep.intervalMs, () => void this.runOnce());
  }

  onApplicationShutdown(): Promise<unknown> | void {
    this.stopSchedule?.();
    return this.running;
  }

  /**
   * Runs one sweep now unless one is already running in this process (then
   * resolves to that run). Across processes, the store lets one sweep at a time.
   */
  runOnce(): Promise<SweepReport> {
    this.running ??= this.sweep().finally(() => (this.running = undefined));
    return this.running;
  }

  private async sweep(): Promise<SweepReport> {
    const { batchSize, maxDurationMs, dutyCycle } = this.options.sweep;
    try {
      const result = await this.store.sweep({ batchSize, maxDurationMs, dutyCycle });
      this.lastRun = { ...result, finishedAt: new Date() };
      this.observer?.emit({ type: 'sweep', failed: false, ...pick(result) });
      if (result.ran) {
        this.logger.log(
          `Swept ${result.deleted} expired keys in ${result.batches} batches, ${result.durationMs} ms (${result.restedMs} ms resting).`,
        );
        if (result.partitions) this.logger.log(messages.sweeper.partitions(result.partitions));
      } else {
        this.logger.debug('Another process is sweeping; skipped.');
      }
    } catch (error) {
      this.lastRun = { ran: false, deleted: 0, batches: 0, durationMs: 0, restedMs: 0, finishedAt: new Date(), error };
      this.observer?.emit({ type: 'sweep', failed: true, ...pick(this.lastRun) });
      this.logger.warn(`Sweep failed: ${error instanceof Error ? error.message : String(error)}`);
    }
    return this.lastRun;
  }
}

function pick(result: SweepResult): { ran: boolean; deleted: number; batches: number; durationMs: number } {
  return { ran: result.ran, deleted: result.deleted, batches: result.batches, durationMs: result.durationMs };
}
