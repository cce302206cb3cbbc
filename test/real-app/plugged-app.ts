import { createHash, randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  Body,
  Controller,
  Header,
  HttpException,
  Injectable,
  Module,
  Post,
  Res,
  ValidationPipe,
  type INestApplication,
  type Provider,
  type Type,
} from '@nestjs/common';
import { APP_PIPE, HttpAdapterHost, NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { getDataSourceToken, TypeOrmModule } from '@nestjs/typeorm';
import fastifyCompress from '@fastify/compress';
import fastifyCookie from '@fastify/cookie';
import fastifyHelmet from '@fastify/helmet';
import fastifySession from '@fastify/session';
import compression from 'compression';
import expressSession from 'express-session';
import helmet from 'helmet';
import { IsInt, IsOptional, IsString, Length, Max, Min } from 'class-validator';
import type { DataSource } from 'typeorm';
import { Idempotent, IdempotencyModule, SkipIdempotency, TransactionHost } from '../../src/index.js';
import { dataSourceOptions } from '../support/database.js';
import type { AdapterName } from '../support/test-app.js';
import { WITHOUT_IDEMPOTENCY, type IdempotencyDecorators } from './controllers.js';
import { CapturingNestLogger } from './log-capture.js';

export const PLUGGED_TENANT = 'plugged';
/** The name of the session cookie on both adapters; the app sets a `csrf` cookie on every answer beside it. */
export const SESSION_COOKIE = 'sid';
const SESSION_SECRET = 'a session secret of at least thirty-two characters';
/** The limit of `/orders/sized`, small enough that a test can cross it by one byte. */
export const SIZED_LIMIT = 2048;

/** `Content-Digest` (RFC 9530) of `bytes`, as the app's digest hook and middleware compute it. */
export function contentDigest(bytes: Buffer | string): string {
  return `sha-256=:${createHash('sha256').update(bytes).digest('base64')}:`;
}

/** Holds `/orders/slow` until the test lets it go, so a duplicate can arrive while it is in flight. */
@Injectable()
export class Gate {
  private waiting = new Map<string, () => void>();
  private opened = new Set<string>();

  wait(label: string): Promise<void> {
    if (this.opened.has(label)) return Promise.resolve();
    return new Promise((resolve) => this.waiting.set(label, resolve));
  }

  open(label: string): void {
    this.opened.add(label);
    this.waiting.get(label)?.();
  }
}

/** The app's writes, in the request's transaction when there is one. */
@Injectable()
export class OrderBook {
  constructor(private readonly tx: TransactionHost) {}

  async record(label: string): Promise<void> {
    await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [PLUGGED_TENANT, label]);
  }
}

export class OrderDto {
  @IsString() @Length(1, 100) label!: string;
  @IsOptional() @IsInt() @Min(0) @Max(2_000_000) size?: number;
}

/** An order long enough (about 6 KiB of JSON) for both compression plugins to compress it. */
function orderOf(label: string) {
  return {
    id: `ord_${label}`,
    label,
    lines: Array.from({ length: 60 }, (_, i) => ({
      line: i + 1,
      sku: `SKU-${String(i).padStart(4, '0')}`,
      description: `A box of ${i + 1} assorted widgets, packed by hand ✓`,
      quantity: (i % 5) + 1,
    })),
  };
}

/** The shop's order routes, with the library's decorators or inert ones. */
export function orderControllers({ Idempotent }: IdempotencyDecorators): Type[] {
  @Controller('orders')
  class OrdersController {
    constructor(
      private readonly book: OrderBook,
      private readonly gate: Gate,
      private readonly adapterHost: HttpAdapterHost,
    ) {}

    @Post()
    @Idempotent()
    async create(@Body() dto: OrderDto, @Res({ passthrough: true }) res: unknown) {
      await this.book.record(dto.label);
      this.adapterHost.httpAdapter.setHeader(res, 'Location', `/orders/ord_${dto.label}`);
      return orderOf(dto.label);
    }

    @Post('small')
    @Idempotent()
    async small(@Body() dto: OrderDto) {
      await this.book.record(dto.label);
      return { id: `ord_${dto.label}` };
    }

    @Post('text')
    @Idempotent()
    @Header('Content-Type', 'text/plain; charset=utf-8')
    async text(@Body() dto: OrderDto): Promise<string> {
      await this.book.record(dto.label);
      return `Receipt for ${dto.label}\n${'Thank you for your order. '.repeat(80)}`;
    }

    /** A declined card: a 4xx from the handler, stored and replayed like a success. */
    @Post('declined')
    @Idempotent()
    async declined(@Body() dto: OrderDto): Promise<never> {
      await this.book.record(dto.label);
      throw new HttpException({ message: 'Your card was declined.', advice: 'Try another card. '.repeat(80) }, 402);
    }

    /** Bytes the handler encoded itself, labelled so: they mean nothing without their Content-Encoding. */
    @Post('pre-encoded')
    @Idempotent()
    @Header('Content-Type', 'text/plain; charset=utf-8')
    @Header('Content-Encoding', 'gzip')
    async preEncoded(@Body() dto: OrderDto): Promise<Buffer> {
      await this.book.record(dto.label);
      return gzipSync(`Archived order ${dto.label}\n${'line '.repeat(400)}`);
    }

    @Post('slow')
    @Idempotent()
    async slow(@Body() dto: OrderDto) {
      await this.gate.wait(dto.label);
      await this.book.record(dto.label);
      return orderOf(dto.label);
    }

    /** Exactly `size` bytes of text, on a route whose limit is SIZED_LIMIT. */
    @Post('sized')
    @Idempotent({ maxResponseBytes: SIZED_LIMIT })
    @Header('Content-Type', 'text/plain; charset=utf-8')
    async sized(@Body() dto: OrderDto): Promise<string> {
      await this.book.record(dto.label);
      return 'x'.repeat(dto.size ?? 0);
    }

    /** A declined card whose error body (`size` bytes of advice and more) is rendered past SIZED_LIMIT. */
    @Post('declined-sized')
    @Idempotent({ maxResponseBytes: SIZED_LIMIT })
    async declinedSized(@Body() dto: OrderDto): Promise<never> {
      await this.book.record(dto.label);
      throw new HttpException({ message: 'Your card was declined.', advice: 'z'.repeat(dto.size ?? 0) }, 402);
    }

    /** `size` bytes of CSV under the module's default limit (1 MiB). */
    @Post('export')
    @Idempotent()
    @Header('Content-Type', 'text/csv; charset=utf-8')
    async export(@Body() dto: OrderDto): Promise<string> {
      await this.book.record(dto.label);
      return 'y'.repeat(dto.size ?? 0);
    }
  }
  return [OrdersController];
}

export interface PluggedApp {
  app: INestApplication;
  url: string;
  gate: Gate;
  nestLog: CapturingNestLogger;
  close(): Promise<void>;
}

/**
 * Boots the shop with the plugins apps put in front of their routes, in
 * `main.ts` after `NestFactory.create`, as their READMEs say: helmet,
 * compression, a session (its cookie and a `csrf` cookie on every answer)
 * and a `Content-Digest` computed from the body as it leaves. With
 * `idempotency: false` it is the same app without `IdempotencyModule`.
 */
export async function startPluggedApp(
  adapter: AdapterName,
  schema: string,
  idempotency: boolean,
  { testingModule = false }: { testingModule?: boolean } = {},
): Promise<PluggedApp> {
  const nestLog = new CapturingNestLogger();
  const withoutModule: Provider[] = [
    {
      provide: TransactionHost,
      useFactory: (dataSource: DataSource) => new TransactionHost(dataSource),
      inject: [getDataSourceToken()],
    },
  ];

  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      ...(idempotency ? [IdempotencyModule.forRoot({ tenant: () => PLUGGED_TENANT, sweep: false })] : []),
    ],
    controllers: orderControllers(idempotency ? { Idempotent, SkipIdempotency } : WITHOUT_IDEMPOTENCY),
    providers: [
      OrderBook,
      Gate,
      ...(idempotency ? [] : withoutModule),
      { provide: APP_PIPE, useValue: new ValidationPipe({ whitelist: true, transform: true }) },
    ],
  })
  class PluggedModule {}

  // As an app's main.ts builds it, or as its e2e tests do (the module's providers then exist before the adapter).
  const testing = testingModule ? await Test.createTestingModule({ imports: [PluggedModule] }).compile() : undefined;
  const create = async <T extends INestApplication>(httpAdapter: ExpressAdapter | FastifyAdapter): Promise<T> =>
    testing
      ? testing.createNestApplication<T>(httpAdapter, { logger: nestLog })
      : NestFactory.create<T>(PluggedModule, httpAdapter, { logger: nestLog, abortOnError: false });
  let app: INestApplication;
  if (adapter === 'express') {
    const express = await create<NestExpressApplication>(new ExpressAdapter());
    express.use(helmet());
    express.use(compression());
    express.use(expressSession({ name: SESSION_COOKIE, secret: SESSION_SECRET, resave: false, saveUninitialized: true }));
    express.use(
      (
        _req: IncomingMessage,
        res: ServerResponse & { cookie(name: string, value: string, options: object): void },
        next: () => void,
      ) => {
        res.cookie('csrf', randomUUID(), { path: '/', sameSite: 'strict' });
        next();
      },
    );
    express.use(digestMiddleware);
    app = express;
  } else {
    const fastify = await create<NestFastifyApplication>(new FastifyAdapter());
    await fastify.register(fastifyHelmet);
    await fastify.register(fastifyCompress);
    await fastify.register(fastifyCookie);
    await fastify.register(fastifySession, {
      cookieName: SESSION_COOKIE,
      secret: SESSION_SECRET,
      saveUninitialized: true,
      cookie: { secure: false, path: '/' },
    });
    const instance = fastify.getHttpAdapter().getInstance();
    instance.addHook('onRequest', (_request, reply, done) => {
      reply.setCookie('csrf', randomUUID(), { path: '/', sameSite: 'strict' });
      done();
    });
    instance.addHook('onSend', (_request, reply, payload, done) => {
      if (typeof payload === 'string' || Buffer.isBuffer(payload)) reply.header('content-digest', contentDigest(payload));
      done(null, payload);
    });
    app = fastify;
  }
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, gate: app.get(Gate), nestLog, close: () => app.close() };
}

/** Express: `Content-Digest` over the body the app ends the response with, set as it leaves. */
function digestMiddleware(_req: IncomingMessage, res: ServerResponse, next: () => void): void {
  const end = res.end.bind(res) as (...args: unknown[]) => ServerResponse;
  res.end = ((...args: unknown[]) => {
    const chunk = args[0];
    if ((typeof chunk === 'string' || Buffer.isBuffer(chunk)) && !res.headersSent)
      res.setHeader('content-digest', contentDigest(chunk));
    return end(...args);
  }) as ServerResponse['end'];
  next();
}
