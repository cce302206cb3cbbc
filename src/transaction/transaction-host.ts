import { Inject, Injectable } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import { IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { PoolDataSource } from '../store/pool-data-source.js';
import { idempotencyContext } from './idempotency-context.js';

/**
 * Gives services the `EntityManager` of the current idempotent request's
 * transaction. Writes made through `manager` commit or roll back together with
 * the key's "completed" marker. Outside an idempotent execution it falls back
 * to the data source's own manager (each write commits on its own).
 *
 * TypeORM only: on a plain pg pool (the module's `pool` option) there is no
 * EntityManager, and `manager` throws, naming the integrations to use.
 */
@Injectable()
export class TransactionHost {
  constructor(@Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource | PoolDataSource) {}

  get manager(): EntityManager {
    if (this.dataSource instanceof PoolDataSource) throw new IdempotencyConfigurationError(messages.config.managerOnPool);
    return idempotencyContext.getStore()?.manager ?? this.dataSource.manager;
  }

  /** True while running inside an idempotent execution's transaction. */
  get isTransactional(): boolean {
    return idempotencyContext.getStore()?.transactional ?? false;
  }
}
