import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { AppModule, type AppModuleConfig } from './app.module.js';

/** Largest accepted request body on both adapters: 1 MiB. */
export const BODY_LIMIT_BYTES = 1024 * 1024;

/**
 * Builds the payments API on the configured adapter, with its schema
 * migrated, ready for `listen()`. Used by `main.ts` and the e2e tests.
 */
export async function createSampleApp(config: AppModuleConfig): Promise<INestApplication> {
  const module = AppModule.forRoot(config);
  const logger = config.logger ? undefined : false;
  if (config.httpAdapter === 'fastify') {
    return NestFactory.create<NestFastifyApplication>(module, new FastifyAdapter({ bodyLimit: BODY_LIMIT_BYTES }), {
      logger,
      abortOnError: false,
    });
  }
  const app = await NestFactory.create<NestExpressApplication>(module, new ExpressAdapter(), { logger, abortOnError: false });
  // Registered before init, so it replaces Express's default 100 kB JSON parser.
  app.useBodyParser('json', { limit: BODY_LIMIT_BYTES });
  return app;
}
