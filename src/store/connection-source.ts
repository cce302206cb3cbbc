import { Module, type DynamicModule, type FactoryProvider, type InjectionToken } from '@nestjs/common';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { IdempotencyModuleExtras } from '../idempotency.module-definition.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import type { SourceDataSource } from './connection.js';
import { moduleMigrations, runModuleMigrations } from './module-migrations.js';
import { PoolDataSource, type PgPool } from './pool-data-source.js';

/** The TypeORM data source the module runs on, as the app registered it (see `typeOrmDataSourceModule`). */
const TYPEORM_DATA_SOURCE = Symbol('IDEMPOTENCY_TYPEORM_DATA_SOURCE');

/** Hosts the alias of the app's TypeORM data source, in a module of its own so that @nestjs/typeorm is loaded only there. */
@Module({})
class IdempotencyTypeOrmDataSourceModule {}

/**
 * Where the module's connections come from: the app's TypeORM data source
 * (the default, `dataSource` naming one), or a plain `pg.Pool` (`pool`). The
 * provider of `IDEMPOTENCY_DATA_SOURCE`, and what it needs imported: on the
 * pool path nothing of typeorm or @nestjs/typeorm is loaded.
 */
export function connectionSource(extras: IdempotencyModuleExtras): {
  provider: FactoryProvider;
  imports: Array<Promise<DynamicModule>>;
} {
  if (extras.pool === undefined) {
    return {
      provider: {
        provide: IDEMPOTENCY_DATA_SOURCE,
        useFactory: (dataSource: SourceDataSource, options: ResolvedIdempotencyOptions) => {
          if (options.migrate) throw new IdempotencyConfigurationError(messages.config.migrateNeedsPool);
          return dataSource;
        },
        inject: [TYPEORM_DATA_SOURCE, IDEMPOTENCY_OPTIONS],
      },
      imports: [typeOrmDataSourceModule(extras.dataSource)],
    };
  }
  if (extras.dataSource !== undefined) throw new IdempotencyConfigurationError(messages.config.poolAndDataSource);
  const given = isPool(extras.pool) ? extras.pool : undefined;
  if (!given && !isToken(extras.pool)) throw new IdempotencyConfigurationError(messages.config.notAPool);
  return {
    provider: {
      provide: IDEMPOTENCY_DATA_SOURCE,
      useFactory: (options: ResolvedIdempotencyOptions, injected?: unknown) => openPoolSource(given ?? injected, options),
      inject: given ? [IDEMPOTENCY_OPTIONS] : [IDEMPOTENCY_OPTIONS, extras.pool as InjectionToken],
    },
    imports: [],
  };
}

/** The module that aliases the app's TypeORM data source (by `name`), loading @nestjs/typeorm only when it is built. */
async function typeOrmDataSourceModule(name?: string): Promise<DynamicModule> {
  const { getDataSourceToken } = await import('@nestjs/typeorm');
  return {
    module: IdempotencyTypeOrmDataSourceModule,
    providers: [{ provide: TYPEORM_DATA_SOURCE, useExisting: getDataSourceToken(name) }],
    exports: [TYPEORM_DATA_SOURCE],
  };
}

/** The module's source on the app's pool, its tables created first when `migrate` says so. */
async function openPoolSource(pool: unknown, options: ResolvedIdempotencyOptions): Promise<PoolDataSource> {
  if (!isPool(pool)) throw new IdempotencyConfigurationError(messages.config.notAPool);
  const source = new PoolDataSource(pool);
  if (options.migrate) {
    await runModuleMigrations(
      source,
      moduleMigrations({
        tableName: options.tableName,
        partitioned: options.partitioned,
        citus: options.citus,
        outboxTableName: options.outbox.configured ? options.outbox.tableName : undefined,
        ledgerTableName: options.ledger.configured ? options.ledger.tableName : undefined,
      }),
    );
  }
  return source;
}

/** A pg.Pool (of whichever copy of pg): it lends clients and answers queries; not `idempotentPool()`'s wrapper (`appPool`). */
function isPool(value: unknown): value is PgPool {
  if (typeof value !== 'object' || value === null || 'appPool' in value) return false;
  const pool = value as Partial<Record<'connect' | 'query' | 'end', unknown>> & { options?: unknown };
  return (
    typeof pool.connect === 'function' &&
    typeof pool.query === 'function' &&
    typeof pool.end === 'function' &&
    typeof pool.options === 'object'
  );
}

function isToken(value: unknown): value is InjectionToken {
  return typeof value === 'string' || typeof value === 'symbol' || typeof value === 'function';
}
