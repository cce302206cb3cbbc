import { NestFactory } from '@nestjs/core';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { AppModule } from './app.module.js';

/** Express unless HTTP_ADAPTER=fastify: the module stores and replays alike on both. */
async function createApp() {
  if (process.env.HTTP_ADAPTER !== 'fastify') return NestFactory.create(AppModule);
  const { FastifyAdapter } = await import('@nestjs/platform-fastify');
  return NestFactory.create<NestFastifyApplication>(AppModule, new FastifyAdapter());
}

const app = await createApp();
app.enableShutdownHooks();
await app.listen(process.env.PORT ?? 3000, '0.0.0.0');
