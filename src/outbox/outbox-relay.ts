import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { scheduleInterval } from '../sweeper/scheduler-registry.js';
import { Outbox } from './outbox.js';
import type { OutboxMessage } from './outbox.store.js';

export type OutboxHandler<P = any> = (message: OutboxMessage<P>) => Promise<void> | void;

/** What one relay round did. */
export interface RelayReport {
  claimed: number;
  delivered: number;
  retried: number;
  deadLettered: number;
  /** Settlements refused because the message's lock had expired and another relay took it. */
  lostLocks: number;
}

/**
 * Delivers outbox messages at least once: claims due messages with
 * `FOR UPDATE SKIP LOCKED` (several relays in parallel never claim the same
 * one), calls the handler registered for the topic, and marks the message
 * delivered, or schedules a retry with exponential backoff and jitter, or
 * dead-letters it after `maxAttempts`. A handler may see a message more than
 * once (a relay that dies after delivering, a lock that times out), so
 * handlers must tolerate duplicates, e.g. by passing `message.id` on as an
 * idempotency key.
 */
@Injectable()
export class OutboxRelay implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('OutboxRelay');
  private readonly handlers = new Map<string, OutboxHandler>();
  private running?: Promise<RelayReport>;
  private stopSchedule?: () => void;

  constructor(
    private readonly outbox: Outbox,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly moduleRef: ModuleRef,
  ) {}

  /** Registers the handler of `topic` (one per topic), e.g. in your service's `onModuleInit`. */
  handle<P = any>(topic: string, handler: OutboxHandler<P>): this {
    if (this.handlers.has(topic)) throw new Error(`OutboxRelay: a handler for "${topic}" is already registered.`);
    this.handlers.set(topic, handler as OutboxHandler);
    return this;
  }

  async onApplicationBootstrap(): Promise<void> {
    const outbox = this.options.outbox;
    if (!outbox.scheduled) return;
    const name = `nest-idempotency:outbox:${outbox.tableName}`;
    this.stopSchedule = await scheduleInterval(this.moduleRef, name, outbox.intervalMs, () => {
      this.relayOnce().catch((error: unknown) => this.logger.warn(`Relay round failed: ${String(error)}`));
    });
  }

  onApplicationShutdown(): Promise<unknown> | void {
    this.stopSchedule?.();
    return this.running?.catch(() => undefined);
  }

  /** One round: claim a batch of due messages and deliver them. Rounds in one process never overlap. */
  relayOnce(): Promise<RelayReport> {
    this.running ??= this.round().finally(() => (this.running = undefined));
    return this.running;
  }

  /** Rounds until no message is due, or `maxRounds` is reached; for tests and scripts. */
  async drain(maxRounds = 100): Promise<RelayReport> {
    const total: RelayReport = { claimed: 0, delivered: 0, retried: 0, deadLettered: 0, lostLocks: 0 };
    for (let i = 0; i < maxRounds; i++) {
      const report = await this.relayOnce();
      for (const k of Object.keys(total) as Array<keyof RelayReport>) total[k] += report[k];
      if (report.claimed === 0) break;
    }
    return total;
  }

  private async round(): Promise<RelayReport> {
    const o = this.options.outbox;
    const report: RelayReport = { claimed: 0, delivered: 0, retried: 0, deadLettered: 0, lostLocks: 0 };
    const { lockToken, messages } = await this.outbox.store.claim(o.batchSize, o.lockMs, randomUUID());
    report.claimed = messages.length;
    const queue = [...messages];
    const worker = async () => {
      for (let message = queue.shift(); message; message = queue.shift()) await this.deliver(message, lockToken, report);
    };
    await Promise.all(Array.from({ length: Math.min(o.concurrency, queue.length) }, worker));
    if (report.claimed > 0) {
      this.logger.log(
        `Relayed ${report.claimed} outbox messages: ${report.delivered} delivered, ${report.retried} to retry, ${report.deadLettered} dead-lettered.`,
      );
    }
    return report;
  }

  private async deliver(message: OutboxMessage, lockToken: string, report: RelayReport): Promise<void> {
    const o = this.options.outbox;
    let settled: boolean;
    try {
      const handler = this.handlers.get(message.topic);
      if (!handler) throw new Error(`No outbox handler is registered for topic "${message.topic}".`);
      await handler(message);
      settled = await this.outbox.store.markDelivered(message.id, lockToken);
      if (settled) report.delivered++;
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      const dead = message.attempt >= o.maxAttempts;
      const base = Math.min(o.maxBackoffMs, o.initialBackoffMs * 2 ** (message.attempt - 1));
      // Jitter spreads retries of messages that failed together (a provider outage).
      const retryIn = Math.round(base / 2 + Math.random() * (base / 2));
      settled = await this.outbox.store.markFailed(message.id, lockToken, reason.slice(0, 2000), dead ? null : retryIn);
      if (settled && dead) report.deadLettered++;
      else if (settled) report.retried++;
      if (dead)
        this.logger.warn(
          `Outbox message ${message.id} (${message.topic}) dead-lettered after ${message.attempt} attempts: ${reason}`,
        );
    }
    if (!settled) report.lostLocks++;
  }
}
