import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Inject,
  InternalServerErrorException,
  Module,
  Post,
  type INestApplication,
  type LoggerService,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import type { EntityManager } from 'typeorm';
import { IdempotencyModule, IdempotencyService, Idempotent, Phased, TransactionHost, type Phases } from '../src/index.js';
import { idempotentPool } from '../src/integrations/pg-pool/index.js';
import { createTables, databaseUrl, dataSourceOptions, freshSchema, installCommitJudge, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { keyTableOptions } from './support/key-table.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

/**
 * The generated client of test/prisma/schema.prisma (the global setup generates it, see
 * support/prisma-generate.ts), imported by a name the type-check does not follow, so that
 * `tsc` passes before it exists; these are the few members the tests use.
 */
interface EffectDelegate {
  create(args: { data: { tenant: string; label: string } }): Promise<unknown>;
}
interface PrismaLike {
  effect: EffectDelegate;
  $transaction<T>(
    fn: (tx: Pick<PrismaLike, 'effect' | '$queryRawUnsafe' | '$transaction'>) => Promise<T>,
    options?: { isolationLevel?: string },
  ): Promise<T>;
  /** The batch form: the operations, unawaited, run in one transaction. */
  $transaction(operations: Array<Promise<unknown>>): Promise<unknown[]>;
  $queryRawUnsafe<T>(sql: string): Promise<T>;
  $on(event: 'query', listener: (event: { query: string }) => void): void;
  $disconnect(): Promise<void>;
}
type PrismaClientClass = new (options: { adapter: PrismaPg; log: Array<{ emit: 'event'; level: 'query' }> }) => PrismaLike;
const GENERATED_CLIENT = './prisma/generated/client.js';

type ClaimMode = 'separate' | 'request-transaction';

/** What a request asks the handler to do, besides writing one effect row (tenant `app`) through Prisma. */
interface Scenario {
  label: string;
  /** `fail`: a 500 after the writes; `fail-first`: only on the label's first attempt. */
  then?: 'fail' | 'fail-first';
  /**
   * `commit`: an interactive $transaction writing a row `app-tx`; `throw`: one that writes it, then throws (caught);
   * `batch`: a batch $transaction writing two; `nested`: one writing `app-tx`, with a nested one (on its `tx` client)
   * that writes `app-nested` and throws (caught).
   */
  tx?: 'commit' | 'throw' | 'batch' | 'nested';
  /** Ask the interactive transaction for this isolation level (Prisma's spelling). */
  isolation?: string;
  delay?: number;
}

const PRISMA = Symbol('prisma');
/** The same app pool wrapped once more, used as node-postgres directly; and Prisma on a pool to another database. */
const RAW = Symbol('raw pool');
const OTHER_DB = Symbol('prisma on another database');

/** What a request to `/raw` does with the wrapped pool itself. */
type RawCase = 'commit-on-pool' | 'left-open' | 'overlap' | 'after-release' | 'leak' | 'parallel';

/** Per label: how many times the handler started, and how many times it reached its answer. */
class Attempts {
  readonly started = new Map<string, number>();
  readonly finished = new Map<string, number>();
  /** What a write the handler left running after its answer met. */
  readonly leaked = new Map<string, string>();
}

interface Dependencies {
  prisma: PrismaLike;
  raw: pg.Pool;
  otherDatabase: PrismaLike;
}

function appModule(schema: string, claimMode: ClaimMode, dependencies: Dependencies, attempts: Attempts) {
  @Controller()
  class EffectsController {
    constructor(
      @Inject(PRISMA) private readonly prisma: PrismaLike,
      @Inject(RAW) private readonly raw: pg.Pool,
      @Inject(OTHER_DB) private readonly otherDatabase: PrismaLike,
      private readonly tx: TransactionHost,
      private readonly idempotency: IdempotencyService,
    ) {}

    // No route of its own: IdempotencyService.execute, as a job would call it.
    @Post('job')
    async job(@Body() body: { label: string; then?: 'fail' }) {
      return this.idempotency
        .execute(
          { tenant: 'tenant-a', key: `job-${body.label}`, payload: body, label: 'prisma-job', onError: 'release' },
          async () => {
            await this.prisma.effect.create({ data: { tenant: 'app', label: body.label } });
            if (body.then === 'fail') throw new Error('the job failed after its write');
            return { done: true };
          },
        )
        .then(
          (result) => ({ result }),
          (error: Error) => ({ failed: error.message }),
        );
    }

    @Post('raw')
    @Idempotent({ onError: 'release' })
    async rawPool(@Body() body: { label: string; case: RawCase; then?: 'fail' }) {
      const { label } = body;
      const insert = 'INSERT INTO effects (tenant, label) VALUES ($1, $2)';
      const refusal = (error: unknown) => (error as Error).message;
      let refused: string | undefined;
      if (body.case === 'commit-on-pool') {
        await this.prisma.effect.create({ data: { tenant: 'app', label } });
        refused = await this.raw.query('COMMIT').then(() => undefined, refusal);
      } else if (body.case === 'left-open') {
        const client = await this.raw.connect();
        await client.query('BEGIN');
        await client.query(insert, ['raw', label]);
        client.release(); // no COMMIT: rolled back to its savepoint
        await this.prisma.effect.create({ data: { tenant: 'app', label } });
      } else if (body.case === 'overlap') {
        const [first, second] = [await this.raw.connect(), await this.raw.connect()];
        await first.query('BEGIN');
        refused = await second.query('BEGIN').then(() => undefined, refusal);
        await first.query(insert, ['raw', label]);
        await first.query('COMMIT');
        first.release();
        second.release();
      } else if (body.case === 'parallel') {
        // The handler's first statements, side by side (in separate mode they carry the deferred BEGIN).
        await Promise.all([1, 2, 3].map(() => this.prisma.effect.create({ data: { tenant: 'app', label } })));
      } else if (body.case === 'leak') {
        // Work the handler does not await: it runs once the key's transaction has ended.
        setTimeout(() => {
          this.prisma.effect.create({ data: { tenant: 'leak', label } }).then(
            () => attempts.leaked.set(label, 'written'),
            (error: Error) => attempts.leaked.set(label, error.message),
          );
        }, 200);
      } else {
        const client = await this.raw.connect();
        client.release();
        refused = await client.query('SELECT 1').then(() => undefined, refusal);
      }
      if (body.then === 'fail') throw new InternalServerErrorException('failed after the writes');
      return { refused };
    }

    @Post('phased')
    // Phases need a claim of their own (refused in request-transaction mode).
    @Idempotent({ phases: true, claimMode: 'separate', onError: 'release' })
    async phased(@Body() body: { label: string; then?: 'fail' }, @Phased() phases: Phases<EntityManager>) {
      const write = async (phase: string, tx: EntityManager) => {
        await this.prisma.effect.create({ data: { tenant: phase, label: body.label } });
        const [{ txid }] = await this.prisma.$queryRawUnsafe<Array<{ txid: string }>>('SELECT txid_current()::text AS txid');
        const [{ txid: phaseTxid }] = (await tx.query('SELECT txid_current()::text AS txid')) as Array<{ txid: string }>;
        return { txid, phaseTxid };
      };
      const first = await phases.run('first', (tx) => write('phase-1', tx));
      const second = await phases.run('second', async (tx) => {
        const ids = await write('phase-2', tx);
        if (body.then === 'fail') throw new Error('the second phase fails');
        return ids;
      });
      return { first, second };
    }

    @Post('other-database')
    @Idempotent()
    async otherDatabaseWrite(@Body() body: { label: string }) {
      const refused = await this.otherDatabase.effect.create({ data: { tenant: 'app', label: body.label } }).then(
        () => undefined,
        (error: Error) => error.message,
      );
      return { refused };
    }

    @Post('effects')
    @Idempotent({ onError: 'release' })
    async create(@Body() body: Scenario) {
      const attempt = (attempts.started.get(body.label) ?? 0) + 1;
      attempts.started.set(body.label, attempt);
      const answer = await this.work(body, attempt);
      attempts.finished.set(body.label, (attempts.finished.get(body.label) ?? 0) + 1);
      return answer;
    }

    // No @Idempotent(): the pool is the app's own.
    @Post('plain')
    async plain(@Body() body: Scenario) {
      return this.work(body, 1);
    }

    private async work(body: Scenario, attempt: number) {
      const { label } = body;
      await this.prisma.effect.create({ data: { tenant: 'app', label } });
      const [{ txid }] = await this.prisma.$queryRawUnsafe<Array<{ txid: string }>>('SELECT txid_current()::text AS txid');
      const [{ txid: moduleTxid }] = (await this.tx.manager.query('SELECT txid_current()::text AS txid')) as Array<{
        txid: string;
      }>;
      let transaction = 'none';
      if (body.tx === 'nested') {
        await this.prisma.$transaction(async (t) => {
          await t.effect.create({ data: { tenant: 'app-tx', label } });
          await t
            .$transaction(async (inner) => {
              await inner.effect.create({ data: { tenant: 'app-nested', label } });
              throw new Error('the nested transaction fails');
            })
            .catch(() => undefined);
        });
      }
      if (body.tx === 'batch') {
        const write = () => this.prisma.effect.create({ data: { tenant: 'app-tx', label } });
        await this.prisma.$transaction([write(), write()]);
      }
      if (body.tx === 'commit' || body.isolation) {
        try {
          await this.prisma.$transaction((t) => t.effect.create({ data: { tenant: 'app-tx', label } }), {
            isolationLevel: body.isolation,
          });
          transaction = 'committed';
        } catch (error) {
          transaction = (error as Error).message;
        }
      }
      let innerTxid: string | undefined;
      if (body.tx === 'throw') {
        await this.prisma
          .$transaction(async (t) => {
            await t.effect.create({ data: { tenant: 'app-tx', label } });
            [{ txid: innerTxid }] = await t.$queryRawUnsafe<Array<{ txid: string }>>('SELECT txid_current()::text AS txid');
            throw new Error('the app’s transaction fails');
          })
          .catch(() => undefined);
        await this.prisma.effect.create({ data: { tenant: 'app-after', label } });
      }
      if (body.delay) await sleep(body.delay);
      if (body.then === 'fail' || (body.then === 'fail-first' && attempt === 1))
        throw new InternalServerErrorException('failed after the writes');
      return { label, attempt, txid, moduleTxid, innerTxid, transaction };
    }
  }

  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({
        tenant: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'],
        sweep: false,
        claimMode,
        ...keyTableOptions(),
      }),
    ],
    controllers: [EffectsController],
    providers: [
      { provide: PRISMA, useValue: dependencies.prisma },
      { provide: RAW, useValue: dependencies.raw },
      { provide: OTHER_DB, useValue: dependencies.otherDatabase },
    ],
  })
  class PrismaAppModule {}
  return PrismaAppModule;
}

/** The same server, its `postgres` database: not the module's. */
function otherDatabaseUrl(): string {
  const url = new URL(databaseUrl());
  url.pathname = '/postgres';
  return url.toString();
}

/** Every line the app logs, for checking that no key reaches a log. */
class CapturingLogger implements LoggerService {
  readonly lines: string[] = [];
  log = (...parts: unknown[]) => this.lines.push(parts.map(String).join(' '));
  error = this.log;
  warn = this.log;
  debug = this.log;
  verbose = this.log;
  fatal = this.log;
}

/**
 * Issue 29: a Prisma 7 app (`@prisma/adapter-pg` on the app's pool, wrapped by
 * `idempotentPool`) gets the module's guarantee: the handler's writes through
 * its PrismaClient commit with the key's completion or roll back with it; its
 * interactive transactions are savepoints of the key's transaction.
 */
describe.each(ADAPTERS)('Prisma through idempotentPool, over %s', (adapter: AdapterName) => {
  describe.each<ClaimMode>(['separate', 'request-transaction'])('claim mode %s', (claimMode) => {
    let app: INestApplication;
    let url: string;
    let db: pg.Client;
    let pool: pg.Pool;
    let prisma: PrismaLike;
    let otherPool: pg.Pool;
    let otherDatabase: PrismaLike;
    const queries: string[] = [];
    const logger = new CapturingLogger();
    const attempts = new Attempts();
    let n = 0;
    const fresh = (kind: string) => `${kind}-${adapter}-${claimMode}-${Date.now()}-${++n}`;
    /** Committed rows per tenant (`app`, `app-tx`, `app-after`) for `label`. */
    const effects = async (label: string) => {
      const { rows } = await db.query('SELECT tenant, count(*)::int AS n FROM effects WHERE label = $1 GROUP BY tenant', [label]);
      return Object.fromEntries(rows.map((r: { tenant: string; n: number }) => [r.tenant, r.n]));
    };
    const keyStatus = async (key: string) =>
      (
        (await db.query('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0] as
          { status: string } | undefined
      )?.status;

    beforeAll(async () => {
      const schema = await freshSchema(`prisma_pool_${adapter}_${claimMode.replace('-', '_')}`);
      await createTables(schema);
      db = await sqlClient(schema);
      // A COMMIT the database refuses: effect rows whose label is listed here fail the deferred trigger.
      await installCommitJudge(db);

      const { PrismaClient } = (await import(GENERATED_CLIENT)) as { PrismaClient: PrismaClientClass };
      pool = new pg.Pool({ connectionString: databaseUrl(), options: `-c search_path=${schema}`, max: 5 });
      prisma = new PrismaClient({
        adapter: new PrismaPg(idempotentPool(pool), { schema }),
        log: [{ emit: 'event', level: 'query' }],
      });
      prisma.$on('query', (event) => queries.push(event.query));
      otherPool = new pg.Pool({ connectionString: otherDatabaseUrl(), max: 2 });
      otherDatabase = new PrismaClient({ adapter: new PrismaPg(idempotentPool(otherPool), { schema }), log: [] });
      const module = appModule(schema, claimMode, { prisma, raw: idempotentPool(pool), otherDatabase }, attempts);
      app =
        adapter === 'express'
          ? await NestFactory.create(module, new ExpressAdapter(), { logger, abortOnError: false })
          : await NestFactory.create(module, new FastifyAdapter(), { logger, abortOnError: false });
      await app.listen(0, '127.0.0.1');
      url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
    });
    afterAll(async () => {
      await app?.close();
      await prisma?.$disconnect();
      await otherDatabase?.$disconnect();
      await pool?.end();
      await otherPool?.end();
      await db?.end();
    });

    it('runs the handler’s Prisma writes in the key’s transaction, committed with its completion, and replays them', async () => {
      const label = fresh('ok');
      const first = await post(url, '/effects', { label }, `k-${label}`);
      const replay = await post(url, '/effects', { label }, `k-${label}`);

      expect(first.status).toBe(201);
      // Prisma's statements and the module's TransactionHost ran in one transaction.
      expect(first.json().txid).toBe(first.json().moduleTxid);
      expect(await effects(label)).toEqual({ app: 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.json()).toEqual(first.json());
      expect(attempts.started.get(label)).toBe(1);
    });

    it('(a) runs 8 concurrent duplicates once: one effect row, the others replay or get 409', async () => {
      const label = fresh('storm');
      const answers = await Promise.all(
        Array.from({ length: 8 }, () => post(url, '/effects', { label, delay: 300 }, `k-${label}`)),
      );

      const ran = answers.filter((a) => a.status === 201 && a.headers['idempotent-replayed'] !== 'true');
      expect(ran).toHaveLength(1);
      for (const answer of answers) expect([201, 409]).toContain(answer.status);
      expect(attempts.started.get(label)).toBe(1);
      expect(await effects(label)).toEqual({ app: 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
    });

    it('(b) rolls the Prisma write back with a 5xx after it, releases the key, and the retry writes once', async () => {
      const label = fresh('fail');
      const failed = await post(url, '/effects', { label, then: 'fail-first' }, `k-${label}`);

      expect(failed.status).toBe(500);
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(`k-${label}`)).toBeUndefined();

      const retry = await post(url, '/effects', { label, then: 'fail-first' }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(await effects(label)).toEqual({ app: 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
    });

    it('(c) leaves neither the completion nor the Prisma write when the database refuses the COMMIT; the retry writes once', async () => {
      const label = fresh('refuse');
      await db.query('INSERT INTO refused_labels (label) VALUES ($1)', [label]);
      const refused = await post(url, '/effects', { label }, `k-${label}`);

      expect(refused.status).toBe(500);
      // The handler's writes went through, and it answered: what failed was the COMMIT with the completion.
      expect(attempts.finished.get(label)).toBe(1);
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(`k-${label}`)).toBeUndefined();

      await db.query('DELETE FROM refused_labels WHERE label = $1', [label]);
      const retry = await post(url, '/effects', { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(attempts.started.get(label)).toBe(2);
      expect(attempts.finished.get(label)).toBe(2);
      expect(await effects(label)).toEqual({ app: 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
    });

    it('(d) commits an interactive $transaction with the key, and rolls it back with a handler that then fails', async () => {
      const committed = fresh('tx-ok');
      const ok = await post(url, '/effects', { label: committed, tx: 'commit' }, `k-${committed}`);
      expect(ok.status).toBe(201);
      expect(ok.json().transaction).toBe('committed');
      expect(await effects(committed)).toEqual({ app: 1, 'app-tx': 1 });

      const label = fresh('tx-fail');
      const failed = await post(url, '/effects', { label, tx: 'commit', then: 'fail' }, `k-${label}`);
      expect(failed.status).toBe(500);
      // Prisma's COMMIT of its transaction committed nothing: the handler's failure took it back.
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(`k-${label}`)).toBeUndefined();
    });

    it('(d) commits a batch $transaction with the key, and rolls it back with a handler that then fails', async () => {
      const committed = fresh('batch-ok');
      expect((await post(url, '/effects', { label: committed, tx: 'batch' }, `k-${committed}`)).status).toBe(201);
      expect(await effects(committed)).toEqual({ app: 1, 'app-tx': 2 });

      const label = fresh('batch-fail');
      expect((await post(url, '/effects', { label, tx: 'batch', then: 'fail' }, `k-${label}`)).status).toBe(500);
      expect(await effects(label)).toEqual({});
    });

    it('(d) undoes only a nested $transaction (on the tx client) that throws, and commits the rest with the key', async () => {
      const label = fresh('nested');
      expect((await post(url, '/effects', { label, tx: 'nested' }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toEqual({ app: 1, 'app-tx': 1 });

      const failing = fresh('nested-fail');
      expect((await post(url, '/effects', { label: failing, tx: 'nested', then: 'fail' }, `k-${failing}`)).status).toBe(500);
      expect(await effects(failing)).toEqual({});
    });

    it('(d) undoes only the writes of a $transaction that throws in a handler that then succeeds (a savepoint)', async () => {
      const label = fresh('tx-throw');
      const answer = await post(url, '/effects', { label, tx: 'throw' }, `k-${label}`);

      expect(answer.status).toBe(201);
      // The app's transaction ran inside the key's: a savepoint of it, not a transaction of its own.
      expect(answer.json().innerTxid).toBe(answer.json().moduleTxid);
      expect(await effects(label)).toEqual({ app: 1, 'app-after': 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
    });

    it('lets an interactive transaction ask for the key’s isolation level, and refuses another', async () => {
      const same = fresh('iso-same');
      const answer = await post(url, '/effects', { label: same, isolation: 'ReadCommitted' }, `k-${same}`);
      expect(answer.json().transaction).toBe('committed');
      expect(await effects(same)).toEqual({ app: 1, 'app-tx': 1 });

      const other = fresh('iso-other');
      const refused = await post(url, '/effects', { label: other, isolation: 'Serializable' }, `k-${other}`);
      expect(refused.status).toBe(201);
      expect(refused.json().transaction).toMatch(/isolation level SERIALIZABLE.*runs at READ COMMITTED/s);
      // The refused transaction's savepoint was rolled back; the handler's own write stayed.
      expect(await effects(other)).toEqual({ app: 1 });
    });

    it('(e) leaves writes outside idempotent handlers to the app’s pool: each commits on its own', async () => {
      const label = fresh('plain');
      const answer = await post(url, '/plain', { label, tx: 'throw' }, undefined);
      expect(answer.status).toBe(201);
      // Another transaction than the module's manager (which, outside a handler, runs each statement on its own).
      expect(answer.json().txid).not.toBe(answer.json().moduleTxid);
      expect(await effects(label)).toEqual({ app: 1, 'app-after': 1 });

      const failing = fresh('plain-fail');
      expect((await post(url, '/plain', { label: failing, tx: 'commit', then: 'fail' }, undefined)).status).toBe(500);
      // No idempotent execution: the writes committed before the failure.
      expect(await effects(failing)).toEqual({ app: 1, 'app-tx': 1 });

      const direct = fresh('direct');
      await prisma.effect.create({ data: { tenant: 'app', label: direct } });
      expect(await effects(direct)).toEqual({ app: 1 });
    });

    it('shows Prisma’s query log only the app’s statements, and no key reaches a log', async () => {
      queries.length = 0;
      const label = fresh('logged');
      const key = `k-${label}`;
      expect((await post(url, '/effects', { label, tx: 'throw' }, key)).status).toBe(201);

      // Prisma logs the ROLLBACK of its transaction (not its BEGIN), as the app sent it: the pool made it a savepoint's.
      expect(queries).toContain('ROLLBACK');
      expect(queries.some((q) => q.includes('INSERT INTO') && q.includes('effects'))).toBe(true);
      for (const query of queries) {
        expect(query).not.toMatch(/idempotency_keys|SAVEPOINT|current_database|pg_postmaster_start_time/);
        expect(query).not.toContain(key);
      }
      expect(logger.lines.filter((line) => line.includes(key) || line.includes(label))).toEqual([]);
    });
    it('refuses a COMMIT sent through pool.query() in a handler: the writes stay the key’s transaction’s', async () => {
      const label = fresh('pool-commit');
      const answer = await post(url, '/raw', { label, case: 'commit-on-pool' }, `k-${label}`);
      expect(answer.status).toBe(201);
      expect(answer.json().refused).toMatch(/a transaction statement sent through pool\.query\(\)/);
      expect(await effects(label)).toEqual({ app: 1 });

      const failing = fresh('pool-commit-fail');
      expect((await post(url, '/raw', { label: failing, case: 'commit-on-pool', then: 'fail' }, `k-${failing}`)).status).toBe(
        500,
      );
      // Had the COMMIT gone through, the write would have outlived the handler's failure.
      expect(await effects(failing)).toEqual({});
    });

    it('rolls back a lent client’s transaction left open at its release, and keeps the handler’s other writes', async () => {
      const label = fresh('left-open');
      const answer = await post(url, '/raw', { label, case: 'left-open' }, `k-${label}`);
      expect(answer.status).toBe(201);
      expect(await effects(label)).toEqual({ app: 1 });
    });

    it('refuses a second transaction of the app’s while one is open on the execution’s connection', async () => {
      const label = fresh('overlap');
      const answer = await post(url, '/raw', { label, case: 'overlap' }, `k-${label}`);
      expect(answer.status).toBe(201);
      expect(answer.json().refused).toMatch(/a second transaction of the app's while one is open/);
      expect(await effects(label)).toEqual({ raw: 1 });
    });

    it('refuses statements on a lent client after its release', async () => {
      const label = fresh('released');
      const answer = await post(url, '/raw', { label, case: 'after-release' }, `k-${label}`);
      expect(answer.json().refused).toMatch(/this client was released/);
    });

    it('refuses a write the handler left running after its transaction ended, rather than run it on a connection lent to another', async () => {
      const label = fresh('leak');
      expect((await post(url, '/raw', { label, case: 'leak' }, `k-${label}`)).status).toBe(201);
      for (let waited = 0; !attempts.leaked.has(label) && waited < 5_000; waited += 50) await sleep(50);
      expect(attempts.leaked.get(label)).toMatch(/the idempotent execution's transaction has ended/);
      expect(await effects(label)).toEqual({});
    });

    it('runs the handler’s first statements sent side by side in the key’s transaction', async () => {
      const label = fresh('parallel');
      expect((await post(url, '/raw', { label, case: 'parallel' }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toEqual({ app: 3 });

      const failing = fresh('parallel-fail');
      expect((await post(url, '/raw', { label: failing, case: 'parallel', then: 'fail' }, `k-${failing}`)).status).toBe(500);
      expect(await effects(failing)).toEqual({});
    });

    it('runs IdempotencyService.execute’s Prisma writes in its transaction', async () => {
      const label = fresh('job');
      expect((await post(url, '/job', { label }, undefined)).json()).toEqual({ result: { done: true } });
      expect(await effects(label)).toEqual({ app: 1 });

      const failing = fresh('job-fail');
      expect((await post(url, '/job', { label: failing, then: 'fail' }, undefined)).json()).toEqual({
        failed: 'the job failed after its write',
      });
      expect(await effects(failing)).toEqual({});
    });

    it('runs each phase’s Prisma writes in that phase’s transaction', async () => {
      const label = fresh('phased');
      const answer = await post(url, '/phased', { label }, `k-${label}`);
      expect(answer.status).toBe(201);
      const { first, second } = answer.json();
      expect(first.txid).toBe(first.phaseTxid);
      expect(second.txid).toBe(second.phaseTxid);
      expect(first.txid).not.toBe(second.txid);
      expect(await effects(label)).toEqual({ 'phase-1': 1, 'phase-2': 1 });

      const failing = fresh('phased-fail');
      expect((await post(url, '/phased', { label: failing, then: 'fail' }, `k-${failing}`)).status).toBe(500);
      // The first phase committed on its own; the second rolled back with its failure.
      expect(await effects(failing)).toEqual({ 'phase-1': 1 });
    });

    it('refuses the app’s statements in a handler when its pool reaches another database than the module', async () => {
      const label = fresh('other-db');
      const answer = await post(url, '/other-database', { label }, `k-${label}`);
      expect(answer.json().refused).toMatch(/the app's pool reaches database "postgres"/);
      // The verdict is kept: the next execution is refused too.
      const again = fresh('other-db');
      expect((await post(url, '/other-database', { label: again }, `k-${again}`)).json().refused).toMatch(
        /the app's pool reaches database "postgres"/,
      );
    });
  });
});
