import { Inject, Injectable, Optional, type OnModuleInit } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';

import type { TransactionOutcome } from '../core/phases.js';

export type { TransactionOutcome } from '../core/phases.js';

/**
 * The app's own transaction manager (`@nestjs-cls/transactional`,
 * `typeorm-transactional`), taught to see the module's transaction as its
 * active one while an idempotent handler runs: its `@Transactional()`
 * methods with the default propagation then join that transaction instead of
 * opening and committing one of their own before the key is completed.
 *
 * Given as the module's `transactionManager`; the implementations live
 * behind their own subpaths (`nest-idempotency-pg/cls-transactional`,
 * `nest-idempotency-pg/typeorm-transactional`), so the root entry never
 * loads their packages.
 */
export interface AppTransactionManager {
  /**
   * Called once at start-up, with the module's data source: loads the app's
   * manager and checks it is set up and manages that data source, else
   * throws an `IdempotencyConfigurationError` that says how to fix it.
   */
  setUp(dataSource: DataSource): Promise<void>;
  /**
   * Runs `work` with `manager` (the module's transaction) as the app
   * manager's active transaction.
   *
   * @param ended settles once the module's transaction (or the phase's, for
   *   phased work) has ended, after `work`
   */
  join<T>(manager: EntityManager, work: () => Promise<T>, ended: Promise<TransactionOutcome>): Promise<T>;
}

/** DI token of the module's `transactionManager` (or undefined). */
export const IDEMPOTENCY_TRANSACTION_MANAGER = Symbol('IDEMPOTENCY_TRANSACTION_MANAGER');

/** Sets the app's transaction manager up at start-up, so a mistake stops the app there rather than at the first request. */
@Injectable()
export class AppTransactionManagerSetUp implements OnModuleInit {
  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Optional() @Inject(IDEMPOTENCY_TRANSACTION_MANAGER) private readonly manager?: AppTransactionManager,
  ) {}

  async onModuleInit(): Promise<void> {
    await this.manager?.setUp(this.dataSource);
  }
}
