import { Module, type DynamicModule, type FactoryProvider, type ModuleMetadata } from '@nestjs/common';
import { DrizzleBinding, type DrizzleDatabase } from './drizzle-binding.js';
import { DrizzleTransactionHost, IDEMPOTENCY_DRIZZLE_BINDING } from './drizzle-transaction-host.js';

export interface IdempotencyDrizzleOptions {
  /**
   * The app's Drizzle database on node-postgres, as `drizzle()` of
   * `drizzle-orm/node-postgres` returns it (`drizzle(pool, { schema })`).
   * Outside idempotent executions `DrizzleTransactionHost#db` is this one;
   * inside them, a transaction with its schema, casing, logger and cache on
   * the module's connection. Its tables must be reachable from the module's
   * data source's connections (the same database, and `search_path`).
   */
  db: DrizzleDatabase<any>; // any schema
}

export interface IdempotencyDrizzleAsyncOptions extends Pick<ModuleMetadata, 'imports'> {
  /** Builds the options, with `inject`'s providers (e.g. the token the app provides its Drizzle database under). */
  useFactory: (...args: any[]) => IdempotencyDrizzleOptions | Promise<IdempotencyDrizzleOptions>;
  inject?: FactoryProvider['inject'];
}

const OPTIONS = Symbol('IDEMPOTENCY_DRIZZLE_OPTIONS');

/**
 * Provides `DrizzleTransactionHost` (globally) for an app that writes through
 * Drizzle, beside `IdempotencyModule`:
 *
 * ```ts
 * IdempotencyDrizzleModule.forRoot({ db })
 * IdempotencyDrizzleModule.forRootAsync({ inject: [DRIZZLE], useFactory: (db: AppDatabase) => ({ db }) })
 * ```
 *
 * drizzle-orm is loaded at start-up, and the database checked there.
 */
@Module({})
export class IdempotencyDrizzleModule {
  static forRoot(options: IdempotencyDrizzleOptions): DynamicModule {
    return IdempotencyDrizzleModule.forRootAsync({ useFactory: () => options });
  }

  static forRootAsync(options: IdempotencyDrizzleAsyncOptions): DynamicModule {
    return {
      module: IdempotencyDrizzleModule,
      global: true,
      imports: options.imports ?? [],
      providers: [
        { provide: OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] },
        {
          provide: IDEMPOTENCY_DRIZZLE_BINDING,
          useFactory: (resolved: IdempotencyDrizzleOptions) => DrizzleBinding.of(resolved?.db, 'IdempotencyDrizzleModule'),
          inject: [OPTIONS],
        },
        DrizzleTransactionHost,
      ],
      exports: [DrizzleTransactionHost],
    };
  }
}
