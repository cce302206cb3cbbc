import { Module, type DynamicModule, type Provider } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { IdempotencyConfigurationError } from './errors/configuration.error.js';
import { messages } from './errors/messages.js';
import {
  IDEMPOTENCY_CLAIM_DATA_SOURCE,
  IDEMPOTENCY_DATA_SOURCE,
  IDEMPOTENCY_OBSERVER,
  IDEMPOTENCY_OPTIONS,
} from './idempotency.constants.js';
import { FastifyCaptureHook } from './http/fastify-capture-hook.js';
import { IdempotentRoutes } from './http/route-settings.js';
import { IdempotencyInterceptor } from './transports/idempotency.interceptor.js';
import { IdempotencyRuntime } from './transports/run-idempotent.js';
import {
  ASYNC_OPTIONS_TYPE,
  ConfigurableModuleClass,
  OPTIONS_TYPE,
  RAW_OPTIONS_TOKEN,
  type IdempotencyModuleExtras,
} from './idempotency.module-definition.js';
import { type IdempotencyModuleOptions, type ResolvedIdempotencyOptions } from './idempotency.options.js';
import { resolveIdempotencyOptions } from './resolve-options.js';
import { IdempotencyService } from './idempotency.service.js';
import { ClaimPoolLifecycle, openClaimPool } from './store/claim-pool.js';
import { IdempotencyEvents } from './telemetry/events.js';
import { createEngineObserver } from './telemetry/opentelemetry.js';
import { IdempotencyStore } from './core/idempotency-store.js';
import { keyTableOf } from './store/idempotency-key.entity.js';
import type { SourceDataSource } from './store/connection.js';
import { connectionSource } from './store/connection-source.js';
import { PostgresIdempotencyStore } from './store/postgres/postgres-idempotency.store.js';
import { IdempotencySchemaCheck } from './store/schema-check.js';
import { installRedactingLogger, QUERY_LOG_REDACTION } from './store/redacting-logger.js';
import { IdempotencySweeper } from './sweeper/idempotency.sweeper.js';
import { Outbox } from './outbox/outbox.js';
import { OutboxRelay } from './outbox/outbox-relay.js';
import { DownstreamKeys } from './transaction/downstream-keys.js';
import { TransactionHost } from './transaction/transaction-host.js';
import {
  AppTransactionManagerSetUp,
  IDEMPOTENCY_TRANSACTION_MANAGER,
  type AppTransactionManager,
} from './transaction/app-transaction-manager.js';
import { EffectLedger } from './ledger/effect-ledger.js';

const EXPORTS = [
  IdempotencyService,
  TransactionHost,
  DownstreamKeys,
  Outbox,
  OutboxRelay,
  IdempotencyStore,
  IdempotencyInterceptor,
  EffectLedger,
  // The interceptor is instantiated in each controller's module, so what it injects must be exported.
  IdempotentRoutes,
  IdempotencyRuntime,
  IdempotencySweeper,
  IdempotencyEvents,
  IDEMPOTENCY_OPTIONS,
  // The operator board (nest-idempotency-pg/board) reads the key and outbox tables on the module's data source.
  IDEMPOTENCY_DATA_SOURCE,
];

/**
 * `IdempotencyModule.forRoot({ tenant: (ctx) => ... })` or
 * `forRootAsync({ imports, inject, useFactory })`; then mark routes with `@Idempotent()`.
 */
@Module({})
export class IdempotencyModule extends ConfigurableModuleClass {
  static override forRoot(options: typeof OPTIONS_TYPE): DynamicModule {
    return IdempotencyModule.withProviders(super.forRoot(options), options);
  }

  static override forRootAsync(options: typeof ASYNC_OPTIONS_TYPE): DynamicModule {
    return IdempotencyModule.withProviders(super.forRootAsync(options), options);
  }

  private static withProviders(definition: DynamicModule, extras: IdempotencyModuleExtras): DynamicModule {
    if (extras.dataSource !== undefined && (typeof extras.dataSource !== 'string' || extras.dataSource === '')) {
      throw new IdempotencyConfigurationError(messages.config.dataSource);
    }
    const source = connectionSource(extras);
    const appTransactions = extras.transactionManager as Partial<AppTransactionManager> | undefined;
    if (
      appTransactions !== undefined &&
      (typeof appTransactions?.join !== 'function' || typeof appTransactions.setUp !== 'function')
    ) {
      throw new IdempotencyConfigurationError(messages.transactionManager.invalid);
    }
    const providers: Provider[] = [
      {
        provide: IDEMPOTENCY_OPTIONS,
        useFactory: (raw: IdempotencyModuleOptions) => resolveIdempotencyOptions(raw),
        inject: [RAW_OPTIONS_TOKEN],
      },
      source.provider,
      { provide: QUERY_LOG_REDACTION, useFactory: installRedactingLogger, inject: [IDEMPOTENCY_DATA_SOURCE] },
      {
        provide: IDEMPOTENCY_CLAIM_DATA_SOURCE,
        // Only the module's own store uses it; a store you bring manages its connections.
        useFactory: (dataSource: SourceDataSource, options: ResolvedIdempotencyOptions) =>
          extras.store ? undefined : openClaimPool(dataSource, options.reservedConnections),
        inject: [IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS],
      },
      ClaimPoolLifecycle,
      IdempotencyEvents,
      {
        provide: IDEMPOTENCY_OBSERVER,
        useFactory: (events: IdempotencyEvents, options: ResolvedIdempotencyOptions) =>
          createEngineObserver(events, options.telemetry),
        inject: [IdempotencyEvents, IDEMPOTENCY_OPTIONS],
      },
      extras.store
        ? { provide: IdempotencyStore, useClass: extras.store }
        : {
            provide: IdempotencyStore,
            useFactory: (
              dataSource: SourceDataSource,
              options: ResolvedIdempotencyOptions,
              claims: SourceDataSource | undefined,
            ) =>
              new PostgresIdempotencyStore(dataSource, keyTableOf(dataSource, options.tableName), {
                preparedStatements: options.preparedStatements,
                claimDataSource: claims,
                partitioned: options.partitioned,
                citus: options.citus,
              }),
            inject: [IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS, IDEMPOTENCY_CLAIM_DATA_SOURCE],
          },
      // A factory, since a value provider cannot be undefined.
      { provide: IDEMPOTENCY_TRANSACTION_MANAGER, useFactory: () => extras.transactionManager },
      AppTransactionManagerSetUp,
      IdempotencyRuntime,
      IdempotencyService,
      TransactionHost,
      DownstreamKeys,
      Outbox,
      OutboxRelay,
      IdempotentRoutes,
      // Under Fastify, the onSend hook where idempotent replies are held (see FastifyReplyCapture).
      FastifyCaptureHook,
      IdempotencyInterceptor,
      EffectLedger,
      IdempotencySweeper,
      IdempotencySchemaCheck,
    ];
    return {
      ...definition,
      // DiscoveryModule: the start-up pass over every controller's routes (IdempotentRoutes).
      imports: [...(definition.imports ?? []), DiscoveryModule, ...source.imports],
      providers: [...(definition.providers ?? []), ...providers],
      exports: [...(definition.exports ?? []), ...EXPORTS],
    };
  }
}
