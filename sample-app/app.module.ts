import { ClassSerializerInterceptor, Logger, Module, ValidationPipe, type DynamicModule } from '@nestjs/common';
import { APP_GUARD, APP_INTERCEPTOR, APP_PIPE } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule } from '@nestjs/graphql';
import { TerminusModule } from '@nestjs/terminus';
import { TypeOrmModule } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';
import { IdempotencyBoardModule } from '../src/board/index.js';
import { IdempotencyHealthModule } from '../src/health/index.js';
import { IdempotencyModule } from '../src/index.js';
import { IdempotencyOpenApiModule } from '../src/openapi/index.js';
import { API_KEYS, ApiKeyGuard, BOARD_CONTROLLERS } from './auth/api-key.guard.js';
import type { AuthenticatedRequest } from './auth/authenticated-request.js';
import { BoardLoginController } from './board-login/board-login.controller.js';
import { BoardSessions } from './board-login/board-sessions.js';
import { ChargesModule } from './charges/charges.module.js';
import type { SampleConfig } from './config.js';
import { dataSourceOptions } from './database/data-source-options.js';
import { runMigrationsSerialised } from './database/migrate.js';
import { faultInjectionProviders } from './faults/fault-injection.interceptor.js';
import { HealthController } from './health/health.controller.js';
import { OrdersModule } from './orders/orders.module.js';
import { FakePaymentProviderModule } from './provider/fake-payment-provider.module.js';
import { RefundsModule } from './refunds/refunds.module.js';

export type AppModuleConfig = SampleConfig & { databaseUrl: string };

@Module({})
export class AppModule {
  static forRoot(config: AppModuleConfig): DynamicModule {
    // The operator board at /board, behind the same API keys: each key's holder sees its own tenant only. A
    // browser signs in at /board/login (BoardLoginController) and the guard takes its session on the board's routes.
    const board = IdempotencyBoardModule.forRoot({
      path: 'board',
      guard: ApiKeyGuard,
      scope: (context) => {
        const tenant = context.switchToHttp().getRequest<AuthenticatedRequest>().tenant;
        return tenant === undefined ? undefined : { tenant };
      },
    });
    return {
      module: AppModule,
      imports: [
        TypeOrmModule.forRootAsync({
          useFactory: () => ({
            ...dataSourceOptions(config.databaseUrl, config.databaseSchema),
            retryAttempts: 3,
            retryDelay: 1_000,
          }),
          dataSourceFactory: async (options) => {
            const dataSource = await new DataSource(options!).initialize();
            try {
              const applied = await runMigrationsSerialised(dataSource);
              if (applied.length > 0) new Logger('Migrations').log(`Applied ${applied.join(', ')}.`);
            } catch (error) {
              await dataSource.destroy();
              throw error;
            }
            return dataSource;
          },
        }),
        // The module's sweeper registers its interval with @nestjs/schedule.
        ScheduleModule.forRoot(),
        // POST /graphql (the refunds' mutation); the request goes into the context, where the module reads its key.
        GraphQLModule.forRoot<ApolloDriverConfig>({
          driver: ApolloDriver,
          autoSchemaFile: true,
          // Apollo's Express integration passes ({ req, res }), its Fastify integration (request, reply).
          context: (first: { req?: unknown; res?: unknown }, reply?: unknown) =>
            first.req ? { req: first.req, res: first.res } : { req: first, reply },
          // Apollo sends each error's stack to the client unless NODE_ENV is production or test: never send it.
          includeStacktraceInErrorResponses: false,
        }),
        IdempotencyModule.forRoot({
          // HTTP and GraphQL: ApiKeyGuard (a global guard) runs before the module's interceptors and sets the tenant.
          // Messages: the merchant account the publisher wrote into the refund request.
          tenant: (context) => {
            if (context.getType() === 'rpc') return context.switchToRpc().getData<{ tenant?: string }>().tenant;
            if (context.getType<string>() === 'graphql')
              return context.getArgByIndex<{ req?: AuthenticatedRequest }>(2)?.req?.tenant;
            return context.switchToHttp().getRequest<AuthenticatedRequest>().tenant;
          },
          lease: config.leaseMs,
          heartbeat: config.heartbeat,
          ttl: config.ttlMs,
          sweep: { interval: config.sweepIntervalMs },
          // The checkout's receipts: delivered by the relay, at least once.
          outbox: { relay: { interval: 500 } },
          // Refunds, once for ever per refund id (the start-up check requires its table).
          ledger: {},
        }),
        // The health indicator for GET /health, and the marks applyIdempotencyToOpenApi documents the routes from.
        TerminusModule,
        IdempotencyHealthModule,
        IdempotencyOpenApiModule,
        ChargesModule,
        OrdersModule.register({ paymentProvider: { url: config.paymentProviderUrl, apiKey: config.paymentProviderKey } }),
        FakePaymentProviderModule.register({ apiKey: config.paymentProviderKey }),
        RefundsModule.register({ consumeMessages: Boolean(config.rabbitmqUrl || config.natsUrl) }),
        board,
      ],
      controllers: [HealthController, BoardLoginController],
      providers: [
        { provide: API_KEYS, useValue: config.apiKeys },
        BoardSessions,
        { provide: BOARD_CONTROLLERS, useValue: board.controllers ?? [] },
        // One instance, the global guard and the board's (which finds it among the app's providers).
        ApiKeyGuard,
        { provide: APP_GUARD, useExisting: ApiKeyGuard },
        {
          provide: APP_PIPE,
          // A rejected body answers 400 before the handler starts, so the module releases the key.
          useValue: new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true, transform: true }),
        },
        // As in most Nest apps: responses are class instances whose @Exclude()d fields (a charge's riskScore) never
        // leave. The idempotency module stores what this produces, so a replay leaves them out too.
        { provide: APP_INTERCEPTOR, useClass: ClassSerializerInterceptor },
        // Test-only crash hook for the reliability suite; registers nothing unless SAMPLE_FAULT_INJECTION=1.
        ...faultInjectionProviders(),
      ],
    };
  }
}
