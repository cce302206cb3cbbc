import { ClassSerializerInterceptor, Module, ValidationPipe, type INestApplication, type Provider } from '@nestjs/common';
import { APP_FILTER, APP_INTERCEPTOR, APP_PIPE, NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { getDataSourceToken, TypeOrmModule } from '@nestjs/typeorm';
import type { DataSource } from 'typeorm';
import { Idempotent, IdempotencyModule, SkipIdempotency, TransactionHost } from '../../src/index.js';
import { dataSourceOptions } from '../support/database.js';
import type { AdapterName } from '../support/test-app.js';
import { EnvelopeInterceptor, ErrorEnvelopeFilter } from './app-wide.js';
import { Ledger, PaymentProvider, shopControllers, WITHOUT_IDEMPOTENCY } from './controllers.js';
import { CapturingNestLogger, CapturingTypeOrmLogger } from './log-capture.js';

/** The single tenant of the shop, named explicitly as a single-tenant app must. */
export const SHOP_TENANT = 'shop';

export interface RealApp {
  app: INestApplication;
  url: string;
  /** Everything TypeORM logged (`logging: 'all'`), parameters included. */
  typeormLog: CapturingTypeOrmLogger;
  /** Everything Nest's application logger received. */
  nestLog: CapturingNestLogger;
  close(): Promise<void>;
}

/**
 * Boots the shop as users build theirs: TypeORM with query logging on, a
 * global validation pipe, a global `ClassSerializerInterceptor`, a global
 * envelope interceptor and a global exception filter of its own shape. With
 * `idempotency: false` it is the same app without `IdempotencyModule`: the
 * same controllers and routes, the library's decorators inert.
 */
export async function startRealApp(adapter: AdapterName, schema: string, idempotency: boolean): Promise<RealApp> {
  const typeormLog = new CapturingTypeOrmLogger();
  const nestLog = new CapturingNestLogger();
  const withoutModule: Provider[] = [
    // Without the module, TransactionHost is what its documentation says it falls back to: the data source's manager.
    {
      provide: TransactionHost,
      useFactory: (dataSource: DataSource) => new TransactionHost(dataSource),
      inject: [getDataSourceToken()],
    },
  ];

  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), logging: 'all', logger: typeormLog, retryAttempts: 0 }),
      ...(idempotency ? [IdempotencyModule.forRoot({ tenant: () => SHOP_TENANT, sweep: false })] : []),
    ],
    controllers: shopControllers(idempotency ? { Idempotent, SkipIdempotency } : WITHOUT_IDEMPOTENCY),
    providers: [
      Ledger,
      PaymentProvider,
      ...(idempotency ? [] : withoutModule),
      { provide: APP_PIPE, useValue: new ValidationPipe({ whitelist: true, transform: true }) },
      // Registered first, so it is the outer one: it serializes what the envelope emits.
      { provide: APP_INTERCEPTOR, useClass: ClassSerializerInterceptor },
      { provide: APP_INTERCEPTOR, useClass: EnvelopeInterceptor },
      { provide: APP_FILTER, useClass: ErrorEnvelopeFilter },
    ],
  })
  class ShopModule {}

  const app =
    adapter === 'express'
      ? await NestFactory.create(ShopModule, new ExpressAdapter(), { logger: nestLog, abortOnError: false })
      : await NestFactory.create(ShopModule, new FastifyAdapter(), { logger: nestLog, abortOnError: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, typeormLog, nestLog, close: () => app.close() };
}
