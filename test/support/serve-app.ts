import { type INestApplication, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';

/**
 * Serves `module` on a free port of 127.0.0.1 over HTTP_ADAPTER (`express` |
 * `fastify`), for a test app run as an OS process of its own (see
 * app-process.ts): prints `listening <port>` once up, or `failed <error>` and
 * exits when it cannot start.
 */
export async function serveApp(module: Type): Promise<INestApplication> {
  let app: INestApplication;
  try {
    app = await NestFactory.create(module, process.env.HTTP_ADAPTER === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), {
      logger: ['error'],
      abortOnError: false,
    });
    await app.listen(0, '127.0.0.1');
  } catch (error) {
    process.stdout.write(`failed ${(error as Error).name}: ${(error as Error).message}\n`);
    process.exit(1);
  }
  const address = app.getHttpServer().address() as { port: number };
  process.stdout.write(`listening ${address.port}\n`);
  return app;
}
