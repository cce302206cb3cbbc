/**
 * An app without TypeORM, set up as docs/transactions.md shows for its ORM:
 * `IdempotencyModule.forRoot({ pool, migrate: true })` on the app's pg pool,
 * and the ORM on that same pool (Prisma through `@prisma/adapter-pg` over
 * `idempotentPool(pool)`, or Drizzle on node-postgres with
 * `IdempotencyDrizzleModule`). Started with `--import
 * ./test/support/without-typeorm.mjs`, under which TypeORM's packages cannot
 * be found; `GET /typeorm` answers which of them the process tried to import
 * or has loaded.
 *
 * Env: DATABASE_URL, APP_SCHEMA, ORM (`prisma` | `drizzle`), HTTP_ADAPTER
 * (`express` | `fastify`), CRASH (`0`: the crashing route no longer kills the
 * process just before the module's COMMIT). Prints `listening <port>` once up, or `failed <error>`.
 */
import 'reflect-metadata';
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { Body, Controller, Get, Inject, Injectable, Module, Post, type Type } from '@nestjs/common';
import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigserial, pgTable, text } from 'drizzle-orm/pg-core';
import pg from 'pg';
import { Idempotent, IdempotencyModule, Phased, type Phases } from '../../src/index.js';
import { EffectLedger } from '../../src/ledger/index.js';
import { DrizzleTransactionHost, IdempotencyDrizzleModule } from '../../src/integrations/drizzle/index.js';
import { idempotentPool } from '../../src/integrations/pg-pool/index.js';
import { serveApp } from './serve-app.js';

const schema = process.env.APP_SCHEMA!;
const orm = process.env.ORM === 'drizzle' ? 'drizzle' : 'prisma';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, options: `-c search_path=${schema}`, max: 5 });

/**
 * Set by the crashing route once its write is done: the next COMMIT a pg client is asked to send (the module's, after
 * the completion) kills the process just before it leaves (SIGKILL: nothing settles, nothing is sent). On the
 * prototype, since the module's deferred BEGIN puts the prototype's `query` back on the clients it hooks.
 */
let crashAtCommit = false;
const clientQuery = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function (this: pg.Client, config: unknown, ...rest: unknown[]) {
  if (crashAtCommit && config === 'COMMIT') process.kill(process.pid, 'SIGKILL');
  return clientQuery.call(this, config, ...rest);
} as typeof pg.Client.prototype.query;

interface TransferBody {
  label: string;
  fail?: boolean;
  waitMs?: number;
}

/** Writes one effect row through the app's ORM: inside an idempotent handler, in the key's transaction. */
interface EffectWriter {
  write(label: string): Promise<void>;
}
const EFFECTS = Symbol('EffectWriter');

// The client the tests' global setup generated from test/prisma/schema.prisma, by a name the type-check does not follow.
const GENERATED_CLIENT = '../prisma/generated/client.js';
interface PrismaEffects {
  effect: { create(args: { data: { tenant: string; label: string } }): Promise<unknown> };
}

async function prismaWriter(): Promise<EffectWriter> {
  const { PrismaClient } = (await import(GENERATED_CLIENT)) as {
    PrismaClient: new (options: { adapter: PrismaPg }) => PrismaEffects;
  };
  const prisma = new PrismaClient({ adapter: new PrismaPg(idempotentPool(pool), { schema }) });
  return { write: async (label) => void (await prisma.effect.create({ data: { tenant: 'app', label } })) };
}

const effects = pgTable('effects', {
  id: bigserial('id', { mode: 'bigint' }).primaryKey(),
  tenant: text('tenant').notNull(),
  label: text('label').notNull(),
});

@Injectable()
class DrizzleWriter implements EffectWriter {
  constructor(private readonly txHost: DrizzleTransactionHost) {}

  async write(label: string): Promise<void> {
    await this.txHost.db.insert(effects).values({ tenant: 'app', label });
  }
}

@Controller()
class TransfersController {
  constructor(
    @Inject(EFFECTS) private readonly writer: EffectWriter,
    private readonly ledger: EffectLedger,
  ) {}

  @Post('transfers')
  @Idempotent({ onError: 'release' })
  async create(@Body() body: TransferBody) {
    await this.writer.write(body.label);
    if (body.waitMs) await new Promise((resolve) => setTimeout(resolve, body.waitMs));
    if (body.fail) throw new Error('the handler failed after its write');
    // Different on every run of the handler: a replay that answers the same bytes did not run it again.
    return { label: body.label, run: randomUUID() };
  }

  /** As `transfers`, the claim the first statement of the handler's transaction (one write of the key row). */
  @Post('transfers-in-tx')
  @Idempotent({ onError: 'release', claimMode: 'request-transaction' })
  createInTransaction(@Body() body: TransferBody) {
    return this.create(body);
  }

  /** Two phases, each committed on its own with its write (`<label>-debit`, `<label>-credit`). */
  @Post('phased-transfers')
  @Idempotent({ phases: true })
  async phased(@Body() body: TransferBody, @Phased() phases: Phases) {
    await phases.run('debit', () => this.writer.write(`${body.label}-debit`));
    await phases.run('credit', () => this.writer.write(`${body.label}-credit`));
    if (body.fail) throw new Error('the handler failed after its phases');
    return { label: body.label, run: randomUUID() };
  }

  /** The write only if the effect ledger had not recorded the business key (`charge:<label>`): once, whatever the key. */
  @Post('ledger-transfers')
  @Idempotent({ onError: 'release' })
  async recorded(@Body() body: TransferBody) {
    const first = await this.ledger.once(`charge:${body.label}`);
    if (first) await this.writer.write(body.label);
    if (body.fail) throw new Error('the handler failed after its write');
    return { label: body.label, first };
  }

  /** As `transfers`, on a short lease with no heartbeat, and the process killed just before the module's COMMIT. */
  @Post('crashing-transfers')
  @Idempotent({ lease: '1s', heartbeat: false })
  async crashing(@Body() body: TransferBody) {
    await this.writer.write(body.label);
    crashAtCommit = process.env.CRASH !== '0';
    return { label: body.label, run: randomUUID() };
  }

  /** Which of TypeORM's packages this process tried to import (the resolve hook's record) or has loaded (require's cache). */
  @Get('typeorm')
  typeorm() {
    const loaded = Object.keys(createRequire(import.meta.url).cache).filter((path) =>
      /[/\\]node_modules[/\\](typeorm|@nestjs[/\\]typeorm|typeorm-transactional|@nestjs-cls[/\\]transactional-adapter-typeorm)[/\\]/.test(
        path,
      ),
    );
    return { attempts: (globalThis as { typeormImportAttempts?: string[] }).typeormImportAttempts ?? null, loaded };
  }
}

const ormImports: Array<Type | ReturnType<typeof IdempotencyDrizzleModule.forRoot>> =
  orm === 'drizzle' ? [IdempotencyDrizzleModule.forRoot({ db: drizzle(pool, { schema: { effects } }) })] : [];
const writer = orm === 'drizzle' ? { provide: EFFECTS, useClass: DrizzleWriter } : { provide: EFFECTS, useFactory: prismaWriter };

@Module({
  imports: [
    IdempotencyModule.forRoot({
      pool,
      migrate: true,
      ledger: {},
      tenant: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'],
      sweep: false,
    }),
    ...ormImports,
  ],
  controllers: [TransfersController],
  providers: [writer],
})
class NoTypeOrmAppModule {}

await serveApp(NoTypeOrmAppModule);
