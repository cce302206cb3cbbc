import { ConfigurableModuleBuilder, type Type } from '@nestjs/common';
import type { IdempotencyModuleOptions } from './idempotency.options.js';
import type { IdempotencyStore } from './core/idempotency-store.js';

/**
 * Options that shape the module's providers, so they are known before any
 * factory runs; given beside the others in `forRoot` and `forRootAsync`.
 */
export interface IdempotencyModuleExtras {
  /** Register the module globally, so `@Idempotent()` works in every module. Default `true`. */
  isGlobal?: boolean;
  /** Name of the TypeORM data source (as given to `TypeOrmModule.forRoot({ name })`). Default: the default one. */
  dataSource?: string;
  /** Your own store class, resolved through DI, instead of `PostgresIdempotencyStore`. */
  store?: Type<IdempotencyStore>;
}

export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: RAW_OPTIONS_TOKEN,
  OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createIdempotencyOptions')
  .setExtras<IdempotencyModuleExtras>({ isGlobal: true, dataSource: undefined, store: undefined }, (definition, extras) => ({
    ...definition,
    global: extras.isGlobal,
  }))
  .build();
