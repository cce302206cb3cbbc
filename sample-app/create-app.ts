import type { INestApplication, LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { applyIdempotencyToOpenApi } from '../src/openapi/index.js';
import { AppModule, type AppModuleConfig } from './app.module.js';
import { declareDeadLetterStream, refundJetStreamServer } from './refunds/jetstream.js';
import { declareDeadLetterQueue, refundConsumerOptions } from './refunds/rabbitmq.js';

/** Largest accepted request body on both adapters: 1 MiB. */
export const BODY_LIMIT_BYTES = 1024 * 1024;

/**
 * Builds the payments API on the configured adapter, with its schema
 * migrated and its OpenAPI document served, ready for `listen()`. Used by
 * `main.ts` and the e2e tests.
 */
export async function createSampleApp(
  config: AppModuleConfig,
  options: { logger?: LoggerService } = {},
): Promise<INestApplication> {
  const module = AppModule.forRoot(config);
  // A test can read the start-up lines through a logger of its own.
  const logger = options.logger ?? (config.logger ? undefined : false);
  let app: INestApplication;
  if (config.httpAdapter === 'fastify') {
    app = await NestFactory.create<NestFastifyApplication>(module, new FastifyAdapter({ bodyLimit: BODY_LIMIT_BYTES }), {
      logger,
      abortOnError: false,
    });
  } else {
    const express = await NestFactory.create<NestExpressApplication>(module, new ExpressAdapter(), {
      logger,
      abortOnError: false,
    });
    // Registered before init, so it replaces Express's default 100 kB JSON parser.
    express.useBodyParser('json', { limit: BODY_LIMIT_BYTES });
    app = express;
  }
  serveOpenApi(app);
  // The refund requests' consumers, only where a broker is given: without RABBITMQ_URL and NATS_URL the app needs none.
  if (config.rabbitmqUrl) {
    await declareDeadLetterQueue(config.rabbitmqUrl, config.refundQueue);
    app.connectMicroservice(refundConsumerOptions(config.rabbitmqUrl, config.refundQueue), { inheritAppConfig: true });
  }
  if (config.natsUrl) {
    const stream = { natsUrl: config.natsUrl, refundStream: config.refundStream, refundSubject: config.refundSubject };
    await declareDeadLetterStream(stream);
    app.connectMicroservice({ strategy: refundJetStreamServer(stream) }, { inheritAppConfig: true });
  }
  if (config.rabbitmqUrl || config.natsUrl) await app.startAllMicroservices();
  return app;
}

/** Swagger UI at `/docs`, the document at `/docs-json`; the idempotent routes document their key and answers. */
function serveOpenApi(app: INestApplication): void {
  const config = new DocumentBuilder().setTitle('Sample payments API').addBearerAuth().build();
  const document = applyIdempotencyToOpenApi(SwaggerModule.createDocument(app, config));
  // Before init, so the routes come ahead of the app's 404 handler.
  SwaggerModule.setup('docs', app, document);
}
