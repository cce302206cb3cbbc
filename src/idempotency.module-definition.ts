import { ConfigurableModuleBuilder, type InjectionToken, type Type } from '@nestjs/common';
import type { IdempotencyModuleOptions } from './idempotency.options.js';
import type { IdempotencyStore } from './core/idempotency-store.js';
import type { PgPool } from './store/pool-data-source.js';
import type { AppTransactionManager } from './transaction/app-transaction-manager.js';

/**
 * Options that shape the module's providers, so they are known before any
 * factory runs; given beside the others in `forRoot` and `forRootAsync`.
 */
export interface IdempotencyModuleExtras {
  /** Register the module globally, so `@Idempotent()` works in every module. Default `true`. */
  isGlobal?: boolean;
  /** Name of the TypeORM data source (as given to `TypeOrmModule.forRoot({ name })`). Default: the default one. */
  dataSource?: string;
  /**
   * Run on a plain `pg.Pool` instead of a TypeORM data source, for an app
   * without TypeORM (Prisma on `@prisma/adapter-pg`, Drizzle on
   * node-postgres): the pool itself (`forRoot({ pool })`), or the token of
   * the provider that gives it (`forRootAsync({ pool: PG_POOL, ... })`). The
   * module's transactions take their connections from it, and it stays the
   * app's to end. Exclusive with `dataSource`. Default: none (TypeORM).
   *
   * It is given here rather than returned by `forRootAsync`'s factory because
   * it decides the module's providers, before any factory runs (as
   * `dataSource` does).
   */
  pool?: PgPool | InjectionToken;
  /** Your own store class, resolved through DI, instead of `PostgresIdempotencyStore`. */
  store?: Type<IdempotencyStore>;
  /**
   * The app's own transaction manager, whose `@Transactional()` methods then
   * join the idempotent handler's transaction: `clsTransactional()` from
   * `nest-idempotency-pg/cls-transactional`, or `typeormTransactional()` from
   * `nest-idempotency-pg/typeorm-transactional`. Default: none (such methods
   * open and commit transactions of their own, before the key is completed).
   */
  transactionManager?: AppTransactionManager;
}

export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: RAW_OPTIONS_TOKEN,
  OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createIdempotencyOptions')
  .setExtras<IdempotencyModuleExtras>(
    { isGlobal: true, dataSource: undefined, pool: undefined, store: undefined, transactionManager: undefined },
    (definition, extras) => ({
      ...definition,
      global: extras.isGlobal,
    }),
  )
  .build();
