/**
 * An app that runs its writes through its own transaction manager, set up as
 * that manager's docs say, in an OS process of its own (started through
 * run-typescript.mjs): `@nestjs-cls/transactional` does not load under Jest's
 * ESM mode on Node 20, and a crash must kill a real process.
 *
 * Env: DATABASE_URL, APP_SCHEMA, HTTP_ADAPTER (`express` | `fastify`),
 * TX_MANAGER (`cls` | `typeorm-transactional` | `typeorm-transactional-als`),
 * JOIN (`0`: the module is not told about the manager, as before this
 * integration), MISCONFIGURE (`1`: the cls manager manages another data
 * source; typeorm-transactional has no data source registered; so start-up
 * must fail). Prints `listening <port>` once up; the
 * `runOnTransaction*` hooks print `hook <event> <label>`.
 *
 * Labels steer the handlers: the schema's deferred trigger refuses the COMMIT
 * of an effect the app's method wrote labelled `refuse-…`; a route's `crash: true` kills the
 * process (SIGKILL, nothing settles) just before the module's COMMIT, unless
 * CRASH is `0`.
 */
import 'reflect-metadata';
import { Body, Controller, Inject, Injectable, Module, Post, type DynamicModule } from '@nestjs/common';
import { getDataSourceToken, InjectDataSource, InjectRepository, TypeOrmModule } from '@nestjs/typeorm';
import {
  ClsPluginTransactional,
  Propagation,
  TransactionHost as ClsTransactionHost,
  Transactional as ClsTransactional,
} from '@nestjs-cls/transactional';
import { TransactionalAdapterTypeOrm } from '@nestjs-cls/transactional-adapter-typeorm';
import { ClsModule } from 'nestjs-cls';
import {
  Column,
  DataSource,
  Entity,
  EventSubscriber,
  PrimaryGeneratedColumn,
  Repository,
  type EntityManager,
  type EntitySubscriberInterface,
  type QueryRunner,
  type TransactionCommitEvent,
} from 'typeorm';
import {
  addTransactionalDataSource,
  initializeTransactionalContext,
  runOnTransactionCommit,
  runOnTransactionRollback,
  StorageDriver,
  Transactional as TypeormTransactional,
} from 'typeorm-transactional';
import { clsTransactional } from '../../src/integrations/cls-transactional/index.js';
import { typeormTransactional } from '../../src/integrations/typeorm-transactional/index.js';
import {
  Idempotent,
  IdempotencyModule,
  IdempotencyService,
  Phased,
  TransactionHost,
  TxManager,
  type Phases,
} from '../../src/index.js';
import { serveApp } from './serve-app.js';

const schema = process.env.APP_SCHEMA!;
const manager = process.env.TX_MANAGER as 'cls' | 'typeorm-transactional' | 'typeorm-transactional-als';
const usesCls = manager === 'cls';
const join = process.env.JOIN !== '0';
const misconfigure = process.env.MISCONFIGURE === '1';
const crashes = process.env.CRASH !== '0';
const print = (line: string) => process.stdout.write(`${line}\n`);

@Entity({ name: 'effects' })
class Effect {
  @PrimaryGeneratedColumn({ type: 'bigint' }) id!: string;
  @Column() tenant!: string;
  @Column() label!: string;
}

const LEDGER = Symbol('LEDGER');

/** The module transactions this app is to die in, just before their COMMIT. */
const crashBeforeCommit = new WeakSet<QueryRunner>();

@EventSubscriber()
class CrashBeforeCommit implements EntitySubscriberInterface {
  beforeTransactionCommit(event: TransactionCommitEvent): void {
    if (crashBeforeCommit.has(event.queryRunner)) process.kill(process.pid, 'SIGKILL');
  }
}

const txid = async (runner: { query(sql: string): Promise<unknown> }) =>
  String(((await runner.query('SELECT txid_current() AS id')) as Array<{ id: string }>)[0].id);

/**
 * The app's own service, written as the manager's docs show: a
 * `@Transactional()` method (default propagation) that writes through the
 * manager's way of reaching its transaction, and reports which transaction
 * that was.
 */
interface Ledger {
  record(label: string, failAfter?: boolean): Promise<string>;
  /** A `@Transactional()` method that calls another one, as services do. */
  recordTwice(label: string): Promise<string[]>;
  /** @nestjs-cls/transactional only: records `label`, then a `Nested` block that writes `<label>-undone` and throws. */
  recordUndoingNested?(label: string): Promise<string>;
}

@Injectable()
class ClsLedger implements Ledger {
  constructor(private readonly txHost: ClsTransactionHost<TransactionalAdapterTypeOrm>) {}

  @ClsTransactional()
  async record(label: string): Promise<string> {
    await this.txHost.tx.getRepository(Effect).insert({ tenant: 'app', label });
    return txid(this.txHost.tx);
  }

  @ClsTransactional()
  async recordTwice(label: string): Promise<string[]> {
    return [await this.record(label), await this.record(label)];
  }

  @ClsTransactional()
  async recordUndoingNested(label: string): Promise<string> {
    const id = await this.record(label);
    await this.txHost
      .withTransaction(Propagation.Nested, async () => {
        await this.txHost.tx.getRepository(Effect).insert({ tenant: 'app', label: `${label}-undone` });
        throw new Error('undo the nested block');
      })
      .catch(() => undefined);
    return id;
  }
}

@Injectable()
class TypeormTransactionalLedger implements Ledger {
  constructor(
    @InjectRepository(Effect) private readonly effects: Repository<Effect>,
    @InjectDataSource() private readonly dataSource: DataSource,
  ) {}

  @TypeormTransactional()
  async record(label: string): Promise<string> {
    // The hooks of the transaction the method runs in: the module's, once joined.
    runOnTransactionCommit(() => print(`hook commit ${label}`));
    runOnTransactionRollback(() => print(`hook rollback ${label}`));
    await this.effects.insert({ tenant: 'app', label });
    return txid(this.dataSource);
  }

  @TypeormTransactional()
  async recordTwice(label: string): Promise<string[]> {
    return [await this.record(label), await this.record(label)];
  }
}

interface Body {
  label: string;
  /** Throw after the app's method has returned (its transaction, if its own, committed by then). */
  fail?: boolean;
}

@Controller()
class TransfersController {
  constructor(
    @Inject(LEDGER) private readonly ledger: Ledger,
    private readonly moduleTx: TransactionHost,
    private readonly idempotency: IdempotencyService,
  ) {}

  /** Writes through the app's manager and through the module's own `TransactionHost`, and says in which transactions. */
  private async transfer(body: Body, crash: boolean) {
    const app = await this.ledger.record(body.label);
    await this.moduleTx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['module', body.label]);
    const module = await txid(this.moduleTx.manager);
    if (crash) crashBeforeCommit.add(this.moduleTx.manager.queryRunner!);
    if (body.fail) throw new Error('the handler failed after its writes');
    return { label: body.label, app, module };
  }

  @Post('transfers')
  @Idempotent()
  create(@Body() body: Body) {
    return this.transfer(body, false);
  }

  @Post('transfers-in-tx')
  @Idempotent({ claimMode: 'request-transaction' })
  createInTransaction(@Body() body: Body) {
    return this.transfer(body, false);
  }

  @Post('crashing-transfers')
  @Idempotent({ lease: '1s', heartbeat: false })
  crashing(@Body() body: Body) {
    return this.transfer(body, crashes);
  }

  @Post('nested-transfers')
  @Idempotent()
  async nested(@Body() body: Body, @TxManager() tx: EntityManager) {
    const app = await this.ledger.recordTwice(body.label);
    return { label: body.label, app, module: await txid(tx) };
  }

  @Post('savepoint-transfers')
  @Idempotent()
  async savepoint(@Body() body: Body, @TxManager() tx: EntityManager) {
    const app = await this.ledger.recordUndoingNested!(body.label);
    return { label: body.label, app, module: await txid(tx) };
  }

  /** Two phases, each committed on its own: the app's method joins each phase's transaction. */
  @Post('phased-transfers')
  @Idempotent({ phases: true })
  async phased(@Body() body: Body, @Phased() phases: Phases<EntityManager>) {
    const first = await phases.run('debit', async (tx) => ({
      app: await this.ledger.record(body.label),
      module: await txid(tx),
    }));
    const second = await phases.run('credit', async (tx) => ({
      app: await this.ledger.record(body.label),
      module: await txid(tx),
    }));
    if (body.fail) throw new Error('the handler failed after its phases');
    return { label: body.label, phases: [first, second] };
  }

  /** Work outside HTTP (a job, a consumer) through IdempotencyService.execute, keyed by the body. */
  @Post('jobs')
  job(@Body() body: Body & { key: string }) {
    return this.idempotency.execute({ tenant: 'tenant-a', key: body.key, payload: body, label: 'job' }, async (manager) => {
      const app = await this.ledger.record(body.label);
      if (body.fail) throw new Error('the job failed after its writes');
      return { label: body.label, app, module: await txid(manager) };
    });
  }

  /** Not idempotent: the app's manager opens and commits its own transaction, as always. */
  @Post('plain-transfers')
  async plain(@Body() body: Body) {
    return { label: body.label, app: await this.ledger.record(body.label) };
  }
}

const dataSourceOptions = {
  type: 'postgres' as const,
  url: process.env.DATABASE_URL,
  schema,
  extra: { options: `-c search_path=${schema}`, max: 6 },
  entities: [Effect],
  subscribers: [CrashBeforeCommit],
  retryAttempts: 0,
};

/** The app's manager, as its docs set it up; misconfigured, it manages another data source than the module's. */
function clsModules(): DynamicModule[] {
  return [
    ...(misconfigure ? [TypeOrmModule.forRoot({ ...dataSourceOptions, name: 'other', subscribers: [] })] : []),
    ClsModule.forRoot({
      global: true,
      middleware: { mount: true },
      plugins: [
        new ClsPluginTransactional({
          imports: [TypeOrmModule],
          adapter: new TransactionalAdapterTypeOrm({ dataSourceToken: getDataSourceToken(misconfigure ? 'other' : undefined) }),
        }),
      ],
    }),
  ];
}

@Module({
  imports: [
    usesCls
      ? TypeOrmModule.forRoot(dataSourceOptions)
      : TypeOrmModule.forRootAsync({
          useFactory: () => dataSourceOptions,
          // As typeorm-transactional's docs say: register the data source once it exists.
          // Misconfigured, it is never registered.
          dataSourceFactory: async (options) =>
            misconfigure ? new DataSource(options!) : addTransactionalDataSource(new DataSource(options!)),
        }),
    TypeOrmModule.forFeature([Effect]),
    ...(usesCls ? clsModules() : []),
    IdempotencyModule.forRoot({
      tenant: (ctx) => String(ctx.switchToHttp().getRequest().headers['x-tenant'] ?? 'none'),
      sweep: false,
      // The one line of this integration.
      ...(join ? { transactionManager: usesCls ? clsTransactional() : typeormTransactional() } : {}),
    }),
  ],
  controllers: [TransfersController],
  providers: [
    usesCls ? ClsLedger : TypeormTransactionalLedger,
    { provide: LEDGER, useExisting: usesCls ? ClsLedger : TypeormTransactionalLedger },
  ],
})
class AppTransactionsModule {}

// typeorm-transactional's docs: before the app is created.
if (!usesCls) {
  initializeTransactionalContext(
    manager === 'typeorm-transactional-als' ? { storageDriver: StorageDriver.ASYNC_LOCAL_STORAGE } : undefined,
  );
}

await serveApp(AppTransactionsModule);
