import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, InternalServerErrorException, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { eq, sql, type Logger as DrizzleLogger } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigserial, pgTable, text } from 'drizzle-orm/pg-core';
import pg from 'pg';
import {
  Idempotent,
  IdempotencyModule,
  IdempotencyService,
  Phased,
  ProblemType,
  TransactionHost,
  type Phases,
} from '../src/index.js';
import { DrizzleTransactionHost, IdempotencyDrizzleModule, type DrizzleDatabase } from '../src/integrations/drizzle/index.js';
import { createTables, databaseUrl, dataSourceOptions, freshSchema, installCommitJudge, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { keyTableOptions } from './support/key-table.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

/** The app's Drizzle schema: the test's effect table (created by createTables). */
const effects = pgTable('effects', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  tenant: text('tenant').notNull(),
  label: text('label').notNull(),
});
const tables = { effects };
type Db = DrizzleDatabase<typeof tables>;

/** Drizzle's logger: every statement that went through Drizzle, with its parameters. */
class RecordingLogger implements DrizzleLogger {
  queries: Array<{ query: string; params: unknown[] }> = [];
  logQuery(query: string, params: unknown[]): void {
    this.queries.push({ query, params });
  }
}

interface Body {
  label: string;
  /** ms to wait after the first write, for duplicates to arrive meanwhile. */
  delay?: number;
  /** Throw a 500 after the writes. */
  fail?: boolean;
}

const txid = async (db: Db) => String((await db.execute<{ id: string }>(sql`SELECT txid_current()::text AS id`)).rows[0].id);

function controller(appDb: Db, kept: { db?: Db }) {
  @Controller('drizzle')
  class DrizzleController {
    constructor(
      private readonly drizzle: DrizzleTransactionHost<typeof tables>,
      private readonly moduleTx: TransactionHost,
      private readonly idempotency: IdempotencyService,
    ) {}

    /** One effect row through the host's Drizzle database; which transactions Drizzle and the module's manager saw. */
    private async write(body: Body) {
      const [row] = await this.drizzle.db
        .insert(effects)
        .values({ tenant: 'drizzle', label: body.label })
        .returning({ id: effects.id });
      if (body.delay) await sleep(body.delay);
      const drizzleTx = await txid(this.drizzle.db);
      const [module] = (await this.moduleTx.manager.query('SELECT txid_current() AS id')) as Array<{ id: string }>;
      if (body.fail) throw new InternalServerErrorException('failed after its Drizzle write');
      return { id: row.id, label: body.label, drizzleTx, moduleTx: String(module.id) };
    }

    @Post('items')
    @Idempotent({ onError: 'release' })
    items(@Body() body: Body) {
      return this.write(body);
    }

    @Post('items-in-tx')
    @Idempotent({ claimMode: 'request-transaction', onError: 'release' })
    itemsInTransaction(@Body() body: Body) {
      return this.write(body);
    }

    /** A Drizzle transaction inside the handler, and one that rolls itself back: both savepoints of the module's. */
    @Post('nested')
    @Idempotent({ onError: 'release' })
    async nested(@Body() body: Body) {
      const db = this.drizzle.db;
      await db.insert(effects).values({ tenant: 'drizzle', label: body.label });
      const inner = await db.transaction(async (tx) => {
        await tx.insert(effects).values({ tenant: 'drizzle', label: `${body.label}-nested` });
        return txid(tx);
      });
      await db
        .transaction(async (tx) => {
          await tx.insert(effects).values({ tenant: 'drizzle', label: `${body.label}-undone` });
          tx.rollback();
        })
        .catch(() => undefined);
      // The relational API, through the app's schema.
      const seen = await db.query.effects.findMany({ where: eq(effects.label, `${body.label}-nested`) });
      if (body.fail) throw new InternalServerErrorException('failed after its nested transaction');
      return { label: body.label, inner, outer: await txid(db), seen: seen.length };
    }

    /** Two phases, each its own transaction: the host's database follows each. */
    @Post('phased')
    @Idempotent({ phases: true })
    async phased(@Body() body: Body, @Phased() phases: Phases) {
      const phase = (name: string) =>
        phases.run(name, async () => {
          await this.drizzle.db.insert(effects).values({ tenant: 'drizzle', label: body.label });
          const [module] = (await this.moduleTx.manager.query('SELECT txid_current()::text AS id')) as Array<{ id: string }>;
          return { drizzleTx: await txid(this.drizzle.db), moduleTx: module.id };
        });
      const done = [await phase('debit'), await phase('credit')];
      if (body.fail) throw new InternalServerErrorException('failed after its phases');
      return { label: body.label, phases: done };
    }

    /** Work outside HTTP (a job, a consumer) through IdempotencyService.execute. */
    @Post('jobs')
    job(@Body() body: Body) {
      return this.idempotency.execute({ tenant: 'tenant-a', key: `job-${body.label}`, payload: body, label: 'job' }, async () => {
        await this.drizzle.db.insert(effects).values({ tenant: 'drizzle', label: body.label });
        if (body.fail) throw new Error('the job failed after its write');
        return { label: body.label, isTransactional: this.drizzle.isTransactional };
      });
    }

    /** Keeps the bound database past its execution, as a bug would. */
    @Post('keep')
    @Idempotent()
    async keep(@Body() body: Body) {
      kept.db = this.drizzle.db;
      await kept.db.insert(effects).values({ tenant: 'drizzle', label: body.label });
      return { label: body.label };
    }

    /** Not idempotent: the app's own database, its transaction its own. */
    @Post('plain')
    async plain(@Body() body: Body) {
      const db = this.drizzle.db;
      await db.insert(effects).values({ tenant: 'drizzle', label: body.label });
      await db.transaction(async (tx) => {
        await tx.insert(effects).values({ tenant: 'drizzle', label: `${body.label}-tx` });
      });
      return { isAppDb: db === appDb, isTransactional: this.drizzle.isTransactional };
    }
  }
  return DrizzleController;
}

/**
 * Drizzle (drizzle-orm on node-postgres) in an idempotent handler, through
 * `DrizzleTransactionHost`: its writes go into the module's transaction, the
 * one that completes the key, on both claim modes; its `transaction()` is a
 * savepoint of it; outside idempotent handlers it is the app's own database.
 */
describe.each(ADAPTERS)('Drizzle in the module’s transaction over %s', (adapter: AdapterName) => {
  let app: INestApplication;
  let url: string;
  let pool: pg.Pool;
  let appDb: Db;
  let db: pg.Client;
  const logger = new RecordingLogger();
  const kept: { db?: Db } = {};
  let n = 0;
  const fresh = (kind: string) => `${kind}-${adapter}-${Date.now()}-${++n}`;
  const count = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0] as
      { status: string } | undefined;

  beforeAll(async () => {
    const schema = await freshSchema(`drizzle_${adapter}`);
    await createTables(schema);
    db = await sqlClient(schema);
    // Effects whose label is listed are refused at COMMIT (a deferred constraint trigger), until taken off the list.
    await installCommitJudge(db);

    pool = new pg.Pool({ connectionString: databaseUrl(), options: `-c search_path=${schema}`, max: 4 });
    appDb = drizzle(pool, { schema: tables, logger });

    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        IdempotencyModule.forRoot({
          tenant: (ctx) => String(ctx.switchToHttp().getRequest().headers['x-tenant']),
          sweep: false,
          ...keyTableOptions(),
        }),
        IdempotencyDrizzleModule.forRoot({ db: appDb }),
      ],
      controllers: [controller(appDb, kept)],
    })
    class DrizzleAppModule {}

    app = await NestFactory.create(DrizzleAppModule, adapter === 'express' ? new ExpressAdapter() : new FastifyAdapter(), {
      logger: process.env.DRIZZLE_SPEC_LOG ? ['error'] : false,
      abortOnError: false,
    });
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => {
    await app?.close();
    await pool?.end();
    await db?.end();
  });

  it('runs the Drizzle write in the module’s transaction: committed with the completed key, replayed after', async () => {
    const label = fresh('ok');
    const first = await post(url, '/drizzle/items', { label }, `k-${label}`);
    const replay = await post(url, '/drizzle/items', { label }, `k-${label}`);

    expect(first.status).toBe(201);
    expect(first.json().drizzleTx).toBe(first.json().moduleTx);
    expect(await count(label)).toBe(1);
    expect((await keyRow(`k-${label}`))?.status).toBe('completed');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text()).toBe(first.text());
    expect(await count(label)).toBe(1);
  });

  it.each([
    ['separate', '/drizzle/items'],
    ['request-transaction', '/drizzle/items-in-tx'],
  ])('concurrent duplicates (claim mode %s): one effect row; the others 409 or replay', async (_mode, path) => {
    const label = fresh('storm');
    const answers = await Promise.all(Array.from({ length: 8 }, () => post(url, path, { label, delay: 300 }, `k-${label}`)));
    const statuses = answers.map((a) => a.status);

    expect(statuses.filter((s) => s === 201)).not.toHaveLength(0);
    expect(statuses.every((s) => s === 201 || s === 409)).toBe(true);
    const ids = new Set(answers.filter((a) => a.status === 201).map((a) => a.json().id));
    expect(ids.size).toBe(1);
    expect(await count(label)).toBe(1);
    expect((await keyRow(`k-${label}`))?.status).toBe('completed');
  });

  it.each([
    ['separate', '/drizzle/items'],
    ['request-transaction', '/drizzle/items-in-tx'],
  ])(
    'rolls the Drizzle write back when the handler fails after it (claim mode %s); the retry writes once',
    async (_mode, path) => {
      const label = fresh('fail');
      const failed = await post(url, path, { label, fail: true }, `k-${label}`);

      expect(failed.status).toBe(500);
      expect(await count(label)).toBe(0);
      // onError: 'release': the key is free at once.
      expect((await keyRow(`k-${label}`))?.status).not.toBe('completed');

      const retry = await post(url, path, { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(await count(label)).toBe(1);
      expect((await keyRow(`k-${label}`))?.status).toBe('completed');
    },
  );

  it.each([
    ['separate', '/drizzle/items'],
    ['request-transaction', '/drizzle/items-in-tx'],
  ])(
    'answers a COMMIT the database refuses (claim mode %s): neither the completion nor the effect; a retry writes once',
    async (_mode, path) => {
      const label = fresh('refuse');
      await db.query('INSERT INTO refused_labels VALUES ($1)', [label]);
      const refused = await post(url, path, { label }, `k-${label}`);

      expect(refused.status).toBe(500);
      expect(refused.json().type).toBe(ProblemType.commitRefused);
      expect(await count(label)).toBe(0);
      expect((await keyRow(`k-${label}`))?.status).not.toBe('completed');

      await db.query('DELETE FROM refused_labels WHERE label = $1', [label]);
      const retry = await post(url, path, { label }, `k-${label}`);
      expect(retry.status).toBe(201);
      expect(await count(label)).toBe(1);
      expect((await keyRow(`k-${label}`))?.status).toBe('completed');
    },
  );

  it('makes db.transaction() a savepoint of the module’s transaction: kept with the key, or rolled back with the handler', async () => {
    const label = fresh('nested');
    const done = await post(url, '/drizzle/nested', { label }, `k-${label}`);

    expect(done.status).toBe(201);
    expect(done.json().inner).toBe(done.json().outer);
    expect(done.json().seen).toBe(1);
    expect(await count(label)).toBe(1);
    expect(await count(`${label}-nested`)).toBe(1);
    // The block that rolled itself back went alone, to its savepoint.
    expect(await count(`${label}-undone`)).toBe(0);
    expect((await keyRow(`k-${label}`))?.status).toBe('completed');

    const failing = fresh('nested-fail');
    expect((await post(url, '/drizzle/nested', { label: failing, fail: true }, `k-${failing}`)).status).toBe(500);
    // The nested block had finished (RELEASE SAVEPOINT), but inside the module's transaction, which rolled back.
    expect(await count(failing)).toBe(0);
    expect(await count(`${failing}-nested`)).toBe(0);
    expect((await keyRow(`k-${failing}`))?.status).not.toBe('completed');
  });

  it('shows Drizzle’s logger the handler’s statements only: savepoints, no BEGIN or COMMIT, nothing of the key', async () => {
    const label = fresh('logged');
    const key = `k-${label}-secret`;
    logger.queries = [];
    expect((await post(url, '/drizzle/nested', { label }, key)).status).toBe(201);
    expect((await post(url, '/drizzle/items-in-tx', { label: `${label}-rtx` }, `${key}-rtx`)).status).toBe(201);

    const texts = logger.queries.map((q) => q.query.toLowerCase());
    expect(texts.some((t) => t.startsWith('insert into "effects"'))).toBe(true);
    expect(texts).toEqual(expect.arrayContaining(['savepoint sp1', 'release savepoint sp1', 'rollback to savepoint sp1']));
    expect(texts.filter((t) => !t.includes('savepoint') && /^(begin|start transaction|commit|rollback)\b/.test(t))).toEqual([]);
    expect(texts.filter((t) => t.includes('idempotency'))).toEqual([]);
    const params = JSON.stringify(logger.queries.map((q) => q.params));
    expect(params).not.toContain('secret');
    expect(params).not.toContain('tenant-a');
  });

  it('follows each phase’s transaction in a phased handler, and keeps the committed phases when it fails later', async () => {
    const label = fresh('phased');
    const response = await post(url, '/drizzle/phased', { label }, `k-${label}`);

    expect(response.status).toBe(201);
    const [debit, credit] = response.json().phases;
    expect(debit.drizzleTx).toBe(debit.moduleTx);
    expect(credit.drizzleTx).toBe(credit.moduleTx);
    expect(debit.moduleTx).not.toBe(credit.moduleTx);
    expect(await count(label)).toBe(2);

    const failing = fresh('phased-fail');
    expect((await post(url, '/drizzle/phased', { label: failing, fail: true }, `k-${failing}`)).status).toBe(500);
    expect(await count(failing)).toBe(2);
  });

  it('writes in the transaction of IdempotencyService.execute, and rolls back with it', async () => {
    const label = fresh('job');
    const done = await post(url, '/drizzle/jobs', { label }, undefined);
    expect(done.status).toBe(201);
    expect(done.json().isTransactional).toBe(true);
    expect(await count(label)).toBe(1);
    expect((await keyRow(`job-${label}`))?.status).toBe('completed');

    const failing = fresh('job-fail');
    expect((await post(url, '/drizzle/jobs', { label: failing, fail: true }, undefined)).status).toBe(500);
    expect(await count(failing)).toBe(0);
  });

  it('refuses statements through a bound database kept past its execution', async () => {
    const label = fresh('kept');
    expect((await post(url, '/drizzle/keep', { label }, `k-${label}`)).status).toBe(201);

    const late = kept.db!.insert(effects).values({ tenant: 'drizzle', label: `${label}-late` });
    // Drizzle wraps what the client threw in its DrizzleQueryError.
    const error = (await late.then(
      () => undefined,
      (e: unknown) => e,
    )) as { cause?: Error } | undefined;
    expect(error?.cause?.message).toMatch(/used after that execution's transaction ended/);
    expect(await count(label)).toBe(1);
    expect(await count(`${label}-late`)).toBe(0);
  });

  it('gives the app’s own database outside idempotent handlers: its writes and transactions commit on their own', async () => {
    const label = fresh('plain');
    const plain = await post(url, '/drizzle/plain', { label }, undefined);

    expect(plain.status).toBe(201);
    expect(plain.json()).toEqual({ isAppDb: true, isTransactional: false });
    expect(await count(label)).toBe(1);
    expect(await count(`${label}-tx`)).toBe(1);
    // And outside any request.
    expect(app.get(DrizzleTransactionHost).db).toBe(appDb);
  });
});

describe('IdempotencyDrizzleModule given something else than a Drizzle database on node-postgres', () => {
  it.each([
    ['an empty object', {}],
    ['an object with a transaction()', { transaction: async () => undefined }],
    ['undefined', undefined],
  ])('stops the app at start-up with a message that says how to fix it: %s', async (_name, db) => {
    @Module({ imports: [IdempotencyDrizzleModule.forRoot({ db: db as never })] })
    class MisconfiguredModule {}

    await expect(
      NestFactory.createApplicationContext(MisconfiguredModule, { logger: false, abortOnError: false }),
    ).rejects.toThrow(
      /^IdempotencyDrizzleModule: the database given is not a Drizzle database on node-postgres\. Give the one drizzle\(\) of 'drizzle-orm\/node-postgres' returns/,
    );
  });
});
