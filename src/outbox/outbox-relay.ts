import { Inject, Injectable, Logger, Optional, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { outboxMessages } from './messages.js';
import type { EngineObserver } from '../core/observer.js';
import { IDEMPOTENCY_OBSERVER, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { scheduleInterval } from '../sweeper/scheduler-registry.js';
import { Outbox } from './outbox.js';
import type { OutboxMessage } from './outbox.store.js';
import { RoundLock, type LockState } from './round-lock.js';

/**
 * Delivers one message. The signal is aborted when the delivery runs past
 * `outbox.relay.deliveryTimeout`: pass it on (`fetch(url, { signal })`) so the
 * work stops. A handler that ignores it cannot be cancelled: it runs on, but
 * its outcome is ignored and the delivery has already counted as failed.
 */
export type OutboxHandler<P = any> = (message: OutboxMessage<P>, signal: AbortSignal) => Promise<void> | void;

/** What one relay round did. */
export interface RelayReport {
  claimed: number;
  delivered: number;
  retried: number;
  deadLettered: number;
  /** Messages another relay took after this one's lock had expired: found before their delivery, or at their settlement. */
  lostLocks: number;
  /** Deliveries that did not settle within `deliveryTimeout` (also counted as retried or dead-lettered). */
  timedOut: number;
  /** Deliveries that succeeded but could not be marked delivered (a database error); marked on a later round. */
  unsettled: number;
  /** Messages not delivered because their lock could not be renewed in time (a database error); tried again after it expires. */
  skipped: number;
}

type DeliveryFailure = { reason: string; timedOut: boolean };

const emptyReport = (): RelayReport => ({
  claimed: 0,
  delivered: 0,
  retried: 0,
  deadLettered: 0,
  lostLocks: 0,
  timedOut: 0,
  unsettled: 0,
  skipped: 0,
});

const reasonOf = (error: unknown) => (error instanceof Error ? error.message : String(error));

/**
 * Delivers outbox messages at least once: claims due messages with
 * `FOR UPDATE SKIP LOCKED` (several relays in parallel never claim the same
 * one), calls the handler registered for the topic, and marks the message
 * delivered, or schedules a retry with exponential backoff and jitter, or
 * dead-letters it after `maxAttempts`. An attempt counts when its message is
 * claimed, whatever ends it: a message whose relay died mid-delivery
 * `maxAttempts` times is dead-lettered before it is delivered again. A
 * delivery that runs past `deliveryTimeout` counts as failed, so one hung
 * handler delays neither the rest of its round, nor later rounds, nor
 * shutdown. A handler may see a message more than once (a relay that dies
 * after delivering, a lock that times out, a timed-out handler that did
 * finish), so handlers must tolerate duplicates, e.g. by passing
 * `message.id` on as an idempotency key.
 */
@Injectable()
export class OutboxRelay implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('OutboxRelay');
  private readonly handlers = new Map<string, OutboxHandler>();
  /**
   * Messages this process delivered but could not mark delivered, by id, with
   * the lock token of that delivery. The token fences the late mark: once
   * another relay has claimed the message again, it is refused.
   */
  private readonly unsettled = new Map<string, string>();
  private running?: Promise<RelayReport>;
  private stopSchedule?: () => void;

  constructor(
    private readonly outbox: Outbox,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly moduleRef: ModuleRef,
    @Optional() @Inject(IDEMPOTENCY_OBSERVER) private readonly observer?: EngineObserver,
  ) {}

  /** Registers the handler of `topic` (one per topic), e.g. in your service's `onModuleInit`. */
  handle<P = any>(topic: string, handler: OutboxHandler<P>): this {
    if (this.handlers.has(topic)) throw new Error(outboxMessages.duplicateHandler(topic));
    this.handlers.set(topic, handler as OutboxHandler);
    return this;
  }

  async onApplicationBootstrap(): Promise<void> {
    const outbox = this.options.outbox;
    if (!outbox.scheduled) return;
    const name = `nest-idempotency:outbox:${outbox.tableName}`;
    this.stopSchedule = await scheduleInterval(this.moduleRef, name, outbox.intervalMs, () => {
      this.relayOnce().catch((error: unknown) => this.logger.warn(outboxMessages.roundFailed(reasonOf(error))));
    });
  }

  /** Stops the schedule and waits for the round in progress, which ends within about `deliveryTimeout`. */
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
    const total = emptyReport();
    for (let i = 0; i < maxRounds; i++) {
      const report = await this.relayOnce();
      for (const k of Object.keys(total) as Array<keyof RelayReport>) total[k] += report[k];
      if (report.claimed === 0) break;
    }
    return total;
  }

  private async round(): Promise<RelayReport> {
    const o = this.options.outbox;
    const report = emptyReport();
    await this.settleEarlierDeliveries(report);
    const lockedAt = RoundLock.now();
    const claim = await this.outbox.store.claim(o.batchSize, o.lockMs, randomUUID(), o.maxAttempts);
    const { lockToken, exhausted } = claim;
    report.claimed = claim.messages.length + exhausted.length;
    for (const message of exhausted) await this.settleExhausted(message, lockToken, report);
    const queue = [...claim.messages];
    const ids = queue.map((m) => m.id);
    const lock = new RoundLock(this.outbox.store, lockToken, o.lockMs, o.deliveryTimeoutMs, ids, lockedAt);
    const worker = async () => {
      for (let message = queue.shift(); message; message = queue.shift()) {
        await this.deliver(message, lock, lockToken, report);
        lock.release(message.id);
      }
    };
    await Promise.all(Array.from({ length: Math.min(o.concurrency, queue.length) }, worker));
    if (report.claimed > 0) this.logger.log(outboxMessages.relayed(report));
    const { claimed, delivered, retried, deadLettered, timedOut, unsettled } = report;
    this.observer?.emit({ type: 'outbox', claimed, delivered, retried, deadLettered, timedOut, unsettled });
    return report;
  }

  /** Marks the messages whose earlier "delivered" mark failed; stops at the first database error, to retry next round. */
  private async settleEarlierDeliveries(report: RelayReport): Promise<void> {
    for (const [id, lockToken] of [...this.unsettled]) {
      let settled: boolean;
      try {
        settled = await this.outbox.store.markDelivered(id, lockToken);
      } catch {
        return;
      }
      this.unsettled.delete(id);
      if (settled) report.delivered++;
      else report.lostLocks++;
    }
  }

  /** Never throws: every outcome is recorded on the message or in the report, so one failure cannot end a round early. */
  private async deliver(message: OutboxMessage, lock: RoundLock, lockToken: string, report: RelayReport): Promise<void> {
    // Claimed again after its "delivered" mark failed: the handler already succeeded, so only the mark is left.
    if (!this.unsettled.delete(message.id)) {
      // Never delivered unless this relay's lock holds until the delivery ends: no two relays send it at once.
      if (!(await this.holdLock(message, lock, report))) return;
      const failure = await this.attempt(message);
      if (failure) return this.recordFailure(message, lockToken, failure, report);
    }
    return this.markDelivered(message, lockToken, report);
  }

  private async holdLock(message: OutboxMessage, lock: RoundLock, report: RelayReport): Promise<boolean> {
    let state: LockState;
    try {
      state = await lock.hold(message.id);
    } catch (error) {
      report.skipped++;
      this.logger.warn(outboxMessages.lockNotRenewed(message.id, message.topic, reasonOf(error)));
      return false;
    }
    if (state === 'held') return true;
    if (state === 'lost') report.lostLocks++;
    else {
      report.skipped++;
      this.logger.warn(outboxMessages.lockNotRenewed(message.id, message.topic, outboxMessages.renewalTooSlow));
    }
    return false;
  }

  /**
   * Never throws. A message whose attempts are spent is dead-lettered without
   * being delivered again, unless this relay delivered it and only its
   * "delivered" mark is left.
   */
  private async settleExhausted(message: OutboxMessage, lockToken: string, report: RelayReport): Promise<void> {
    if (this.unsettled.delete(message.id)) return this.markDelivered(message, lockToken, report);
    const reason = outboxMessages.attemptsExhausted(message.attempt, this.options.outbox.maxAttempts);
    let settled: boolean;
    try {
      settled = await this.outbox.store.markExhausted(message.id, lockToken, reason);
    } catch (error) {
      this.logger.warn(outboxMessages.exhaustedUnrecorded(message.id, message.topic, reasonOf(error)));
      return;
    }
    if (!settled) {
      report.lostLocks++;
      return;
    }
    report.deadLettered++;
    this.logger.warn(outboxMessages.deadLettered(message.id, message.topic, message.attempt, reason));
  }

  private async markDelivered(message: OutboxMessage, lockToken: string, report: RelayReport): Promise<void> {
    let settled: boolean;
    try {
      settled = await this.outbox.store.markDelivered(message.id, lockToken);
    } catch (error) {
      // Not a failed attempt: the message was delivered. It must not move toward dead-lettering for this.
      this.unsettled.set(message.id, lockToken);
      report.unsettled++;
      this.logger.warn(outboxMessages.unsettled(message.id, message.topic, reasonOf(error)));
      return;
    }
    if (settled) report.delivered++;
    else report.lostLocks++;
  }

  /** Runs the handler within `deliveryTimeout`; returns why it failed, or nothing when it succeeded in time. */
  private async attempt(message: OutboxMessage): Promise<DeliveryFailure | undefined> {
    const handler = this.handlers.get(message.topic);
    if (!handler) return { reason: outboxMessages.noHandler(message.topic), timedOut: false };
    const timeoutMs = this.options.outbox.deliveryTimeoutMs;
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timed-out'>((resolve) => (timer = setTimeout(() => resolve('timed-out'), timeoutMs)));
    const delivery = (async () => handler(message, controller.signal))();
    try {
      if ((await Promise.race([delivery.then(() => 'delivered' as const), timedOut])) === 'delivered') return undefined;
      const reason = outboxMessages.deliveryTimedOut(timeoutMs);
      controller.abort(new DOMException(reason, 'TimeoutError'));
      // The handler's promise cannot be cancelled. Whatever it settles to later is ignored: this relay never
      // settles the message for it, so a late success cannot mark a message another relay has claimed since.
      delivery.catch(() => undefined);
      return { reason, timedOut: true };
    } catch (error) {
      return { reason: reasonOf(error), timedOut: false };
    } finally {
      clearTimeout(timer);
    }
  }

  private async recordFailure(message: OutboxMessage, lockToken: string, failure: DeliveryFailure, report: RelayReport) {
    const o = this.options.outbox;
    const dead = message.attempt >= o.maxAttempts;
    const base = Math.min(o.maxBackoffMs, o.initialBackoffMs * 2 ** (message.attempt - 1));
    // Jitter spreads retries of messages that failed together (a provider outage).
    const retryIn = Math.round(base / 2 + Math.random() * (base / 2));
    if (failure.timedOut) report.timedOut++;
    let settled: boolean;
    try {
      settled = await this.outbox.store.markFailed(message.id, lockToken, failure.reason.slice(0, 2000), dead ? null : retryIn);
    } catch (error) {
      // The attempt was counted when the message was claimed; it is retried once its lock expires.
      this.logger.warn(outboxMessages.failureUnrecorded(message.id, message.topic, reasonOf(error)));
      return;
    }
    if (!settled) report.lostLocks++;
    else if (dead) {
      report.deadLettered++;
      this.logger.warn(outboxMessages.deadLettered(message.id, message.topic, message.attempt, failure.reason));
    } else report.retried++;
  }
}
