/**
 * An app that writes through Drizzle with `@nestjs-cls/transactional` and its
 * Drizzle adapter, set up as their docs say, and `clsTransactionalDrizzle()`
 * as the module's `transactionManager`; in an OS process of its own (started
 * through run-typescript.mjs), since nestjs-cls does not load under Jest's
 * ESM mode on Node 20.
 *
 * Env: DATABASE_URL, APP_SCHEMA, HTTP_ADAPTER (`express` | `fastify`),
 * MISCONFIGURE (`1`: the adapter is given something that is not a Drizzle
 * database on node-postgres, so start-up must fail), CRASH (`0`: the crashing
 * route no longer kills the process just before the module's COMMIT).
 * Prints `listening <port>` once up, or `failed <name>: <message>`.
 */
import 'reflect-metadata';
import { Body, Controller, Global, Injectable, Module, Post } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { ClsPluginTransactional, Propagation, Transactional, TransactionHost } from '@nestjs-cls/transactional';
import { TransactionalAdapterDrizzleOrm } from '@nestjs-cls/transactional-adapter-drizzle-orm';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigserial, pgTable, text } from 'drizzle-orm/pg-core';
import { ClsModule } from 'nestjs-cls';
import pg from 'pg';
import { EventSubscriber, type EntitySubscriberInterface, type QueryRunner, type TransactionCommitEvent } from 'typeorm';
import { clsTransactionalDrizzle } from '../../src/integrations/drizzle/index.js';
import { Idempotent, IdempotencyModule, TransactionHost as ModuleTransactionHost } from '../../src/index.js';
import { serveApp } from './serve-app.js';

const schema = process.env.APP_SCHEMA!;
const misconfigure = process.env.MISCONFIGURE === '1';
const crashes = process.env.CRASH !== '0';

/** The module transactions this app is to die in (SIGKILL, nothing settles), just before their COMMIT. */
const crashBeforeCommit = new WeakSet<QueryRunner>();

@EventSubscriber()
class CrashBeforeCommit implements EntitySubscriberInterface {
  beforeTransactionCommit(event: TransactionCommitEvent): void {
    if (crashBeforeCommit.has(event.queryRunner)) process.kill(process.pid, 'SIGKILL');
  }
}

const effects = pgTable('effects', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  tenant: text('tenant').notNull(),
  label: text('label').notNull(),
});

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, options: `-c search_path=${schema}`, max: 4 });
const db = drizzle(pool, { schema: { effects } });
type Db = typeof db;

/** The app's token for its Drizzle database, as the adapter's docs have it. */
const DRIZZLE = Symbol('DRIZZLE');

@Global()
@Module({
  // Misconfigured: something with a transaction() that is not a Drizzle database.
  providers: [{ provide: DRIZZLE, useValue: misconfigure ? { transaction: () => undefined } : db }],
  exports: [DRIZZLE],
})
class DrizzleModule {}

const txid = async (tx: Db) => String((await tx.execute<{ id: string }>(sql`SELECT txid_current()::text AS id`)).rows[0].id);

/** The app's own service, written as the adapter's docs show. */
@Injectable()
class Ledger {
  constructor(private readonly txHost: TransactionHost<TransactionalAdapterDrizzleOrm<Db>>) {}

  @Transactional()
  async record(label: string): Promise<string> {
    await this.txHost.tx.insert(effects).values({ tenant: 'app', label });
    return txid(this.txHost.tx);
  }

  @Transactional()
  async recordTwice(label: string): Promise<string[]> {
    return [await this.record(label), await this.record(label)];
  }

  /** Records `label`, then a `Nested` block that writes `<label>-undone` and throws. */
  @Transactional()
  async recordUndoingNested(label: string): Promise<string> {
    const id = await this.record(label);
    await this.txHost
      .withTransaction(Propagation.Nested, async () => {
        await this.txHost.tx.insert(effects).values({ tenant: 'app', label: `${label}-undone` });
        throw new Error('undo the nested block');
      })
      .catch(() => undefined);
    return id;
  }
}

interface Body {
  label: string;
  /** Throw after the app's method has returned. */
  fail?: boolean;
}

@Controller()
class TransfersController {
  constructor(
    private readonly ledger: Ledger,
    private readonly moduleTx: ModuleTransactionHost,
  ) {}

  /** Writes through the app's @Transactional() method, and says in which transaction it and the module's manager were. */
  private async transfer(body: Body) {
    const app = await this.ledger.record(body.label);
    const module = await this.moduleTxid();
    if (body.fail) throw new Error('the handler failed after its writes');
    return { label: body.label, app, module };
  }

  /** The transaction of the module's own TypeORM manager (TransactionHost of nest-idempotency-pg). */
  private async moduleTxid(): Promise<string> {
    const [row] = (await this.moduleTx.manager.query('SELECT txid_current()::text AS id')) as Array<{ id: string }>;
    return row.id;
  }

  @Post('transfers')
  @Idempotent({ onError: 'release' })
  create(@Body() body: Body) {
    return this.transfer(body);
  }

  @Post('transfers-in-tx')
  @Idempotent({ claimMode: 'request-transaction', onError: 'release' })
  createInTransaction(@Body() body: Body) {
    return this.transfer(body);
  }

  @Post('nested-transfers')
  @Idempotent()
  async nested(@Body() body: Body) {
    const app = await this.ledger.recordTwice(body.label);
    return { label: body.label, app, module: await this.moduleTxid() };
  }

  @Post('savepoint-transfers')
  @Idempotent()
  async savepoint(@Body() body: Body) {
    const app = await this.ledger.recordUndoingNested(body.label);
    return { label: body.label, app, module: await this.moduleTxid() };
  }

  @Post('crashing-transfers')
  @Idempotent({ lease: '1s', heartbeat: false })
  async crashing(@Body() body: Body) {
    const done = await this.transfer(body);
    if (crashes) crashBeforeCommit.add(this.moduleTx.manager.queryRunner!);
    return done;
  }

  /** Not idempotent: the method opens and commits a transaction of its own, as always. */
  @Post('plain-transfers')
  async plain(@Body() body: Body) {
    return { label: body.label, app: await this.ledger.record(body.label) };
  }
}

@Module({
  imports: [
    DrizzleModule,
    ClsModule.forRoot({
      global: true,
      middleware: { mount: true },
      plugins: [
        new ClsPluginTransactional({
          imports: [DrizzleModule],
          adapter: new TransactionalAdapterDrizzleOrm({ drizzleInstanceToken: DRIZZLE }),
        }),
      ],
    }),
    // The module's own statements still go through TypeORM: a data source with no entities.
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      extra: { options: `-c search_path=${schema}`, max: 6 },
      subscribers: [CrashBeforeCommit],
      retryAttempts: 0,
    }),
    IdempotencyModule.forRoot({
      tenant: (ctx) => String(ctx.switchToHttp().getRequest().headers['x-tenant'] ?? 'none'),
      sweep: false,
      // The one line of this integration.
      transactionManager: clsTransactionalDrizzle(),
    }),
  ],
  controllers: [TransfersController],
  providers: [Ledger],
})
class DrizzleClsAppModule {}

await serveApp(DrizzleClsAppModule);
