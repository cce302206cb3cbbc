import {
  Body,
  Controller,
  Get,
  Header,
  HttpCode,
  HttpException,
  Injectable,
  Module,
  Param,
  Post,
  Redirect,
  Res,
  StreamableFile,
  UnauthorizedException,
  ValidationPipe,
  type INestApplication,
  type LoggerService,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IsInt, IsString, Max, Min } from 'class-validator';
import type { EntityManager, LoggerOptions, Logger as TypeOrmLogger } from 'typeorm';
import {
  Idempotent,
  IdempotencyModule,
  SkipIdempotency,
  Phased,
  TransactionHost,
  TxManager,
  type Phases,
  type IdempotencyModuleOptions,
} from '../../src/index.js';
import { dataSourceOptions } from './database.js';
import { keyTableOptions } from './key-table.js';

export type AdapterName = 'express' | 'fastify';
export const ADAPTERS: AdapterName[] = ['express', 'fastify'];

/** What the handlers did, as seen from inside the process. */
export class Probe {
  invocations = new Map<string, number>();
  /** Per-label queue of delays (ms) consumed by successive invocations of `/slow`. */
  delays = new Map<string, number[]>();
  /** Labels whose next `/phased` attempt fails right after this phase. */
  crashAfter = new Map<string, string>();

  count(label: string): number {
    return this.invocations.get(label) ?? 0;
  }
  record(label: string): void {
    this.invocations.set(label, this.count(label) + 1);
  }
  nextDelay(label: string): number {
    return this.delays.get(label)?.shift() ?? 0;
  }
}

@Injectable()
class Ledger {
  constructor(private readonly tx: TransactionHost) {}

  /** Writes one effect row through the request's transaction, found via AsyncLocalStorage. */
  async write(tenant: string, label: string): Promise<string> {
    const [row] = (await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2) RETURNING id', [
      tenant,
      label,
    ])) as Array<{ id: string }>;
    return row.id;
  }
}

class ChargeDto {
  @IsInt() @Min(1) @Max(1000) amount!: number;
  @IsString() label!: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const tenantOf = (body: { tenant?: string } | undefined) => body?.tenant ?? 'none';

function controllers(probe: Probe) {
  @Controller()
  class EffectsController {
    constructor(private readonly ledger: Ledger) {}

    @Post('items')
    @Idempotent()
    async create(@Body() body: { label: string; tenant?: string }) {
      probe.record(body.label);
      const id = await this.ledger.write(tenantOf(body), body.label);
      return { id, label: body.label, note: body };
    }

    // The same handler with its answers kept for replays from memory, whatever the module says.
    @Post('items-remembered')
    @Idempotent({ replayFromMemory: true })
    async createRemembered(@Body() body: { label: string; tenant?: string }) {
      return this.create(body);
    }

    // ... and never kept.
    @Post('items-forgotten')
    @Idempotent({ replayFromMemory: false })
    async createForgotten(@Body() body: { label: string; tenant?: string }) {
      return this.create(body);
    }

    @Post('slow')
    @Idempotent()
    async slow(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['slow', body.label]);
      await sleep(probe.nextDelay(body.label));
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('long')
    @Idempotent({ lease: 400, ttl: '1h' })
    async long(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['long', body.label]);
      await sleep(probe.nextDelay(body.label));
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('waiting')
    @Idempotent({ wait: '3s' })
    async waiting(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['waiting', body.label]);
      await sleep(probe.nextDelay(body.label));
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('hung')
    // A handler that hangs: the heartbeat keeps its key for maxHold, then lets it go.
    @Idempotent({ lease: 300, maxHold: 900, ttl: '1h' })
    async hung(@Body() body: { label: string }) {
      probe.record(body.label);
      await this.ledger.write('hung', body.label);
      await sleep(probe.nextDelay(body.label));
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('refused-stored')
    @Idempotent({ onError: 'store' })
    async refusedStored(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['refused-stored', body.label]);
      return { label: body.label };
    }

    @Post('in-tx')
    @Idempotent({ claimMode: 'request-transaction', wait: '3s' })
    async inTransaction(
      @Body() body: { label: string; fail?: 'decline' | 'boom' | 'sql-decline' | 'sql-swallowed' },
      @TxManager() manager: EntityManager,
    ) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['in-tx', body.label]);
      await sleep(probe.nextDelay(body.label));
      // A statement of the handler's that fails aborts its transaction: nothing but a rollback runs in it after that.
      if (body.fail === 'sql-decline' || body.fail === 'sql-swallowed')
        await manager.query('SELECT 1 / 0').catch(() => undefined);
      if (body.fail === 'decline' || body.fail === 'sql-decline') throw new HttpException({ message: 'declined' }, 402);
      if (body.fail === 'boom') throw new Error('unexpected failure');
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('in-tx-own-row')
    @Idempotent({ claimMode: 'request-transaction' })
    async inTransactionOwnRow(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      const [{ n }] = (await manager.query('SELECT count(*)::int AS n FROM idempotency_keys WHERE key = $1', [
        `k-${body.label}`,
      ])) as Array<{ n: number }>;
      return { rowsSeenByHandler: n };
    }

    @Post('in-tx-settings')
    @Idempotent({ claimMode: 'request-transaction', wait: '3s' })
    async inTransactionSettings(@TxManager() manager: EntityManager) {
      // What the handler's statements run with, after the claim in the same transaction.
      const [row] = (await manager.query('SHOW lock_timeout')) as Array<{ lock_timeout: string }>;
      return { lockTimeout: row.lock_timeout };
    }

    @Post('short-lease')
    // Outruns its lease on purpose, as a stalled process would: without a heartbeat the key can be taken over.
    @Idempotent({ lease: 600, ttl: '1h', heartbeat: false })
    async shortLease(@Body() body: { label: string; fail?: boolean }) {
      probe.record(body.label);
      await this.ledger.write('short', body.label);
      await sleep(probe.nextDelay(body.label));
      if (body.fail) throw new Error('provider exploded');
      return { label: body.label, attempt: probe.count(body.label) };
    }

    @Post('decline')
    @Idempotent()
    async decline(@Body() body: { label: string }) {
      probe.record(body.label);
      await this.ledger.write('decline', body.label);
      throw new HttpException({ type: 'card_declined', message: 'Your card was declined.' }, 402);
    }

    @Post('boom')
    @Idempotent({ lease: 800, ttl: '1h' })
    async boom(@Body() body: { label: string }) {
      probe.record(body.label);
      await this.ledger.write('boom', body.label);
      throw new Error('unexpected failure');
    }

    @Post('boom-release')
    @Idempotent({ onError: 'release' })
    async boomRelease(@Body() body: { label: string }) {
      probe.record(body.label);
      await this.ledger.write('boom', body.label);
      throw new Error('unexpected failure');
    }

    @Post('validated')
    @Idempotent()
    async validated(@Body(new ValidationPipe({ whitelist: true })) body: ChargeDto) {
      probe.record(body.label);
      await this.ledger.write('validated', body.label);
      return { amount: body.amount, label: body.label };
    }

    @Post('unicode')
    @Idempotent()
    unicode(@Body() body: { label: string }) {
      probe.record(body.label);
      return {
        text: 'nul:\u0000 emoji:🦄 rtl:שלום cjk:漢字 lone:\ud800 quote:" slash:\\',
        order: { z: 1, a: 2 },
        label: body.label,
      };
    }

    @Post('text')
    @Idempotent()
    text(@Body() body: { label: string }) {
      probe.record(body.label);
      return `plain text for ${body.label} ✓`;
    }

    @Post('empty')
    @Idempotent()
    @HttpCode(204)
    async empty(@Body() body: { label: string }) {
      probe.record(body.label);
      await this.ledger.write('empty', body.label);
    }

    @Post('buffer')
    @Idempotent()
    buffer(@Body() body: { label: string }) {
      probe.record(body.label);
      return Buffer.from([0x00, 0xff, 0xfe, 0x80, 0x0a, 0x0d, ...Buffer.from(body.label)]);
    }

    @Post('located')
    @Idempotent({ required: true })
    @HttpCode(202)
    @Header('Location', '/items/42')
    @Header('ETag', '"v1"')
    @Header('X-Not-Stored', 'per-response')
    located(@Body() body: { label: string }, @Res({ passthrough: true }) res: { cookie?: unknown; header?: unknown }) {
      probe.record(body.label);
      setHeader(res, 'Set-Cookie', 'session=secret');
      setHeader(res, 'X-Custom-Replayed', 'yes');
      return { accepted: body.label };
    }

    @Post('redirect')
    @Idempotent()
    @Redirect('/somewhere', 303)
    redirect(@Body() body: { label: string }) {
      probe.record(body.label);
      return { url: `/charges/${body.label}` };
    }

    @Post('stream')
    @Idempotent()
    stream(@Body() body: { label: string }) {
      probe.record(body.label);
      return new StreamableFile(Buffer.from('streamed'));
    }

    @Post('phased')
    @Idempotent({ phases: true })
    async phased(@Body() body: { label: string }, @Phased() phases: Phases<EntityManager>) {
      const crash = (phase: string) => {
        if (probe.crashAfter.get(body.label) === phase) {
          probe.crashAfter.delete(body.label);
          throw new Error(`crash after ${phase}`);
        }
      };
      const first = await phases.run('first', async () => {
        probe.record(`${body.label}:first`);
        return this.ledger.write('phased', `${body.label}:first`);
      });
      crash('first');
      const second = await phases.run('second', async (tx) => {
        probe.record(`${body.label}:second`);
        await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['phased', `${body.label}:second`]);
        return { downstreamKey: phases.key('provider', { maxLength: 64 }) };
      });
      crash('second');
      return { first, second, resumed: phases.resumed };
    }

    @Post('optional')
    @Idempotent({ required: false })
    async optional(@Body() body: { label: string }, @TxManager() manager: EntityManager) {
      probe.record(body.label);
      await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['optional', body.label]);
      return { label: body.label };
    }

    @Post('custom-fingerprint')
    @Idempotent({ fingerprint: (ctx) => ctx.switchToHttp().getRequest<{ body: { amount: number } }>().body.amount })
    customFingerprint(@Body() body: { label: string; amount: number }) {
      probe.record(body.label);
      return { label: body.label, amount: body.amount };
    }

    @Post('prepared-statements')
    @Idempotent()
    async preparedStatements(@TxManager() manager: EntityManager) {
      // The statements prepared on this request's connection (with a pool of one, the claim's too).
      const rows = (await manager.query('SELECT name FROM pg_prepared_statements ORDER BY name')) as Array<{ name: string }>;
      return rows.map((r) => r.name);
    }

    @Post('plain/:label')
    notIdempotent(@Param('label') label: string) {
      probe.record(label);
      return { label };
    }
  }

  @Controller('scoped')
  @Idempotent()
  class ScopedController {
    @Post('on')
    on(@Body() body: { label: string }) {
      probe.record(body.label);
      return { label: body.label, at: probe.count(body.label) };
    }

    @Post('off')
    @SkipIdempotency()
    off(@Body() body: { label: string }) {
      probe.record(body.label);
      return { label: body.label, at: probe.count(body.label) };
    }

    @Get('health')
    @Idempotent({ required: false })
    health() {
      return { ok: true };
    }
  }

  @Controller('mostly-off')
  @Idempotent()
  @SkipIdempotency()
  class MostlyOffController {
    @Post('off')
    off(@Body() body: { label: string }) {
      probe.record(body.label);
      return { at: probe.count(body.label) };
    }

    @Post('back-on')
    @SkipIdempotency(false)
    backOn(@Body() body: { label: string }) {
      probe.record(body.label);
      return { at: probe.count(body.label) };
    }
  }

  return [EffectsController, ScopedController, MostlyOffController];
}

function setHeader(res: unknown, name: string, value: string): void {
  const r = res as { header?: (n: string, v: string) => void; setHeader?: (n: string, v: string) => void };
  if (typeof (r as { code?: unknown }).code === 'function' && r.header) r.header(name, value);
  else r.setHeader?.(name, value);
}

export interface TestApp {
  app: INestApplication;
  url: string;
  probe: Probe;
  close(): Promise<void>;
}

/** Boots the test API on a real port with the given adapter and module options. */
export async function startTestApp(
  adapter: AdapterName,
  schema: string,
  options: Partial<IdempotencyModuleOptions> = {},
  extra: { logger?: TypeOrmLogger; logging?: LoggerOptions; nestLogger?: LoggerService; url?: string; poolSize?: number } = {},
): Promise<TestApp> {
  const probe = new Probe();
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema, extra), retryAttempts: 0 }),
      IdempotencyModule.forRoot({
        tenant: (ctx) => {
          const tenant = ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'];
          // Stand-ins for a resolver that fails: a bug, and a deliberate refusal.
          if (tenant === 'resolver-bug') throw new TypeError('cannot read the principal');
          if (tenant === 'resolver-refuses') throw new UnauthorizedException('No principal on this request.');
          // Stand-ins for a resolver whose answer the store could not hold as it is.
          if (tenant === 'resolver-empty') return '';
          if (tenant === 'resolver-buffer') return Buffer.from('tenant-a') as unknown as string;
          if (tenant === 'resolver-lone-surrogate') return 'tenant-a\ud800';
          if (tenant === 'resolver-nul') return 'tenant-a\u0000';
          return tenant;
        },
        sweep: false,
        replayHeaders: ['X-Custom-Replayed'],
        ...keyTableOptions(),
        ...options,
      }),
    ],
    controllers: controllers(probe),
    providers: [Ledger],
  })
  class TestModule {}

  const app =
    adapter === 'express'
      ? await NestFactory.create(TestModule, new ExpressAdapter(), { logger: extra.nestLogger ?? false, abortOnError: false })
      : await NestFactory.create(TestModule, new FastifyAdapter(), { logger: extra.nestLogger ?? false, abortOnError: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, probe, close: () => app.close() };
}
