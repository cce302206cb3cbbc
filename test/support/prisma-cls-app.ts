/**
 * A Prisma 7 app whose writes go through `@nestjs-cls/transactional` with its
 * Prisma adapter, set up as that adapter's docs say, on a `PrismaClient` over
 * `idempotentPool(pool)`; the module is not told about the manager
 * (`transactionManager` is for the TypeORM adapter). An OS process of its own
 * (started through run-typescript.mjs): `nestjs-cls` 6 does not load under
 * Jest's ESM mode on Node 20.
 *
 * Env: DATABASE_URL, APP_SCHEMA, HTTP_ADAPTER (`express` | `fastify`), CRASH
 * (`0`: the crashing route no longer kills the process just before the
 * module's COMMIT). Prints `listening <port>` once up, or `failed <error>`.
 */
import 'reflect-metadata';
import { Body, Controller, Injectable, Module, Post } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { ClsPluginTransactional, Propagation, Transactional, TransactionHost } from '@nestjs-cls/transactional';
import { TransactionalAdapterPrisma } from '@nestjs-cls/transactional-adapter-prisma';
import { PrismaPg } from '@prisma/adapter-pg';
import { ClsModule } from 'nestjs-cls';
import pg from 'pg';
import { EventSubscriber, type EntitySubscriberInterface, type QueryRunner, type TransactionCommitEvent } from 'typeorm';
import { Idempotent, IdempotencyModule, TransactionHost as ModuleTransactionHost } from '../../src/index.js';
import { idempotentPool } from '../../src/integrations/pg-pool/index.js';
import { dataSourceOptions } from './database.js';
import { serveApp } from './serve-app.js';

const schema = process.env.APP_SCHEMA!;
const crashes = process.env.CRASH !== '0';

/** The module transactions this app is to die in (SIGKILL: nothing settles, nothing is sent), just before their COMMIT. */
const crashBeforeCommit = new WeakSet<QueryRunner>();

@EventSubscriber()
class CrashBeforeCommit implements EntitySubscriberInterface {
  beforeTransactionCommit(event: TransactionCommitEvent): void {
    if (crashBeforeCommit.has(event.queryRunner)) process.kill(process.pid, 'SIGKILL');
  }
}

// The client the tests' global setup generated from test/prisma/schema.prisma, by a name the type-check does not follow.
const GENERATED_CLIENT = '../prisma/generated/client.js';
interface EffectsClient {
  effect: { create(args: { data: { tenant: string; label: string } }): Promise<unknown> };
  $queryRawUnsafe<T>(sql: string): Promise<T>;
  $transaction<T>(fn: (tx: EffectsClient) => Promise<T>, options?: unknown): Promise<T>;
  $disconnect(): Promise<void>;
}
const { PrismaClient } = (await import(GENERATED_CLIENT)) as {
  PrismaClient: new (options: { adapter: PrismaPg }) => EffectsClient;
};

/** The app's PrismaClient, on its own pool wrapped by idempotentPool. */
const PRISMA = Symbol('PrismaClient');
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, options: `-c search_path=${schema}`, max: 5 });

@Module({
  providers: [{ provide: PRISMA, useValue: new PrismaClient({ adapter: new PrismaPg(idempotentPool(pool), { schema }) }) }],
  exports: [PRISMA],
})
class PrismaModule {}

const txid = async (client: EffectsClient) =>
  (await client.$queryRawUnsafe<Array<{ id: string }>>('SELECT txid_current()::text AS id'))[0].id;

type Adapter = TransactionalAdapterPrisma<EffectsClient>;

@Injectable()
class Ledger {
  constructor(private readonly txHost: TransactionHost<Adapter>) {}

  @Transactional()
  async record(label: string): Promise<string> {
    await this.txHost.tx.effect.create({ data: { tenant: 'app', label } });
    return txid(this.txHost.tx);
  }

  /** Records `label`, then a `Nested` block (the adapter's own savepoint) that writes `<label>-undone` and throws. */
  @Transactional()
  async recordUndoingNested(label: string): Promise<string> {
    const id = await this.record(label);
    await this.txHost
      .withTransaction(Propagation.Nested, async () => {
        await this.txHost.tx.effect.create({ data: { tenant: 'app', label: `${label}-undone` } });
        throw new Error('undo the nested block');
      })
      .catch(() => undefined);
    return id;
  }
}

interface Body {
  label: string;
  fail?: boolean;
  nested?: boolean;
}

@Controller()
class TransfersController {
  constructor(
    private readonly ledger: Ledger,
    private readonly moduleTx: ModuleTransactionHost,
  ) {}

  @Post('transfers')
  @Idempotent({ onError: 'release' })
  create(@Body() body: Body) {
    return this.transfer(body);
  }

  /** As `transfers`, on a short lease with no heartbeat, and the process killed just before the module's COMMIT. */
  @Post('crashing-transfers')
  @Idempotent({ lease: '1s', heartbeat: false })
  async crashing(@Body() body: Body) {
    const done = await this.transfer(body);
    if (crashes) crashBeforeCommit.add(this.moduleTx.manager.queryRunner!);
    return done;
  }

  private async transfer(body: Body) {
    const app = body.nested ? await this.ledger.recordUndoingNested(body.label) : await this.ledger.record(body.label);
    await this.moduleTx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['module', body.label]);
    const [{ id: module }] = (await this.moduleTx.manager.query('SELECT txid_current()::text AS id')) as Array<{ id: string }>;
    if (body.fail) throw new Error('the handler failed after its writes');
    return { label: body.label, app, module };
  }
}

@Module({
  imports: [
    TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0, subscribers: [CrashBeforeCommit] }),
    PrismaModule,
    ClsModule.forRoot({
      global: true,
      middleware: { mount: true },
      plugins: [
        new ClsPluginTransactional({
          imports: [PrismaModule],
          adapter: new TransactionalAdapterPrisma({ prismaInjectionToken: PRISMA, sqlFlavor: 'postgresql' }),
        }),
      ],
    }),
    IdempotencyModule.forRoot({
      tenant: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'],
      sweep: false,
    }),
  ],
  controllers: [TransfersController],
  providers: [Ledger],
})
class PrismaClsModule {}

await serveApp(PrismaClsModule);
