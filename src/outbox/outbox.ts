import { Inject, Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../store/connection.js';
import { asWorkManager } from '../store/work-manager.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { idempotencyContext } from '../transaction/idempotency-context.js';
import { OutboxStore } from './outbox.store.js';

export interface EnqueueOptions {
  /** Defaults to the tenant of the idempotent request or execution running now. */
  tenant?: string | null;
  /** Deliver no sooner than this many milliseconds from now. */
  delayMs?: number;
  /** The transaction to join; defaults to the current idempotent execution's (what `TransactionHost.manager` gives on TypeORM). */
  manager?: EntityManager;
}

/**
 * Writes side effects that cannot take an idempotency key (an email, an SMS,
 * a webhook) to the outbox table in the same transaction as the business
 * change: the message exists if and only if the change committed. The
 * `OutboxRelay` then delivers it at least once.
 */
@Injectable()
export class Outbox {
  readonly store: OutboxStore;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: SourceDataSource,
    @Inject(IDEMPOTENCY_OPTIONS) options: ResolvedIdempotencyOptions,
  ) {
    this.store = new OutboxStore(dataSource, options.outbox.tableName, { citus: options.citus });
  }

  /**
   * Adds a message in the current transaction. Outside one (no idempotent
   * request or phase running, and no `manager` given) the insert commits on
   * its own, which gives up the atomicity the outbox exists for.
   *
   * @returns the message id
   */
  enqueue(topic: string, payload: unknown, options: EnqueueOptions = {}): Promise<string> {
    const tenant = options.tenant === undefined ? (idempotencyContext.getStore()?.scope?.tenant ?? null) : options.tenant;
    // The execution's transaction read here rather than through TransactionHost, whose manager is TypeORM's only.
    const manager = options.manager ?? idempotencyContext.getStore()?.manager ?? asWorkManager(this.dataSource.manager);
    return this.store.enqueue(manager, { tenant, topic, payload, delayMs: options.delayMs });
  }
}
