import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, type INestApplication, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import pg from 'pg';
import {
  Idempotent,
  IdempotencyConfigurationError,
  IdempotencyModule,
  IdempotencyService,
  migrateIdempotencyTables,
  TransactionHost,
} from '../src/index.js';
import { idempotentPool } from '../src/integrations/pg-pool/index.js';
import { Outbox, OutboxRelay } from '../src/outbox/index.js';
import { databaseUrl, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { post } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const PG_POOL = Symbol('PG_POOL');
const tenant = (ctx: { switchToHttp(): { getRequest<T>(): T } }) =>
  ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'];

function poolOn(schema: string): pg.Pool {
  return new pg.Pool({ connectionString: databaseUrl(), options: `-c search_path=${schema}`, max: 4 });
}

@Controller()
class EffectsController {
  constructor(private readonly host: TransactionHost) {}

  @Post('effects')
  @Idempotent()
  async create(@Body() body: { label: string; viaHost?: boolean }) {
    if (body.viaHost) await this.host.manager.query('SELECT 1');
    return { label: body.label, at: process.hrtime.bigint().toString() };
  }
}

@Controller()
class OrdersController {
  constructor(private readonly outbox: Outbox) {}

  @Post('orders')
  @Idempotent({ onError: 'release' })
  async create(@Body() body: { id: string; fail?: boolean }) {
    await this.outbox.enqueue('order.created', { id: body.id });
    if (body.fail) throw new Error('the handler failed after its enqueue');
    return { id: body.id };
  }
}

async function start(
  imports: unknown[],
  adapter: AdapterName,
  controllers: Type[] = [EffectsController],
): Promise<INestApplication> {
  @Module({ imports: imports as never[], controllers })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), {
    logger: false,
    abortOnError: false,
  });
  await app.listen(0, '127.0.0.1');
  return app;
}

const urlOf = (app: INestApplication) => `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;

describe.each(ADAPTERS)('the pool option, over %s', (adapter: AdapterName) => {
  let schema: string;
  let pool: pg.Pool;
  let db: pg.Client;
  let app: INestApplication;

  beforeAll(async () => {
    schema = await freshSchema(`pool_option_${adapter}`);
    pool = poolOn(schema);
    db = await sqlClient(schema);
    // The pool comes from the app's own provider; the module takes its token beside the factory.
    @Module({ providers: [{ provide: PG_POOL, useValue: pool }], exports: [PG_POOL] })
    class DatabaseModule {}
    app = await start(
      [
        IdempotencyModule.forRootAsync({
          pool: PG_POOL,
          imports: [DatabaseModule],
          useFactory: () => ({ tenant, migrate: true, sweep: false as const }),
        }),
      ],
      adapter,
    );
  });
  afterAll(async () => {
    await app?.close();
    await db?.end();
    await pool?.end();
  });

  it('takes the pool by token in forRootAsync, creates the key table and answers a replay from it', async () => {
    const first = await post(urlOf(app), '/effects', { label: 'a' }, `k-a-${adapter}`);
    const replay = await post(urlOf(app), '/effects', { label: 'a' }, `k-a-${adapter}`);

    expect(first.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body.equals(first.body)).toBe(true);
    const { rows } = await db.query('SELECT status FROM idempotency_keys WHERE key = $1', [`k-a-${adapter}`]);
    expect(rows).toEqual([{ status: 'completed' }]);
  });

  it('leaves the app’s pool open when the app closes', async () => {
    const other = poolOn(schema);
    const closing = await start([IdempotencyModule.forRoot({ pool: other, tenant, sweep: false })], adapter);
    await closing.close();
    const { rows } = await other.query('SELECT 1 AS one');
    expect(rows).toEqual([{ one: 1 }]);
    await other.end();
  });

  it('refuses TransactionHost.manager on a pool, naming the integrations to use', async () => {
    const answer = await post(urlOf(app), '/effects', { label: 'host', viaHost: true }, `k-host-${adapter}`);
    expect(answer.status).toBe(500);
    expect(() => app.get(TransactionHost).manager).toThrow(/DrizzleTransactionHost[\s\S]*idempotentPool/);
  });

  it('runs IdempotencyService.execute on the pool, its manager answering statements in the key’s transaction', async () => {
    const service = app.get(IdempotencyService);
    const key = `k-exec-${adapter}`;
    const result = await service.execute({ tenant: 'tenant-a', key, payload: { n: 1 } }, async (manager) => {
      await manager.query('CREATE TABLE IF NOT EXISTS executed (key text PRIMARY KEY)');
      await manager.query('INSERT INTO executed (key) VALUES ($1)', [key]);
      return manager.query("SELECT current_setting('search_path') AS path");
    });
    expect((result as Array<{ path: string }>)[0].path).toBe(schema);
    const again = await service.execute({ tenant: 'tenant-a', key, payload: { n: 1 } }, async () => 'ran again');
    expect(again).toEqual(result);
    expect((await db.query('SELECT key FROM executed')).rows).toEqual([{ key }]);
  });

  it('sweeps expired keys on the pool, and only those', async () => {
    const key = `k-swept-${adapter}`;
    expect((await post(urlOf(app), '/effects', { label: 'swept' }, key)).status).toBe(201);
    await db.query(
      `UPDATE idempotency_keys SET expires_at = now() - interval '1 hour', expiry_floor = now() - interval '1 hour'
                     WHERE key = $1`,
      [key],
    );

    const swept = await app.get(IdempotencyService).sweep();

    expect(swept).toMatchObject({ ran: true, deleted: 1 });
    expect((await db.query('SELECT key FROM idempotency_keys WHERE key = $1', [key])).rows).toEqual([]);
    expect((await db.query('SELECT count(*)::int AS n FROM idempotency_keys')).rows[0].n).toBeGreaterThan(0);
  });
});

describe.each(ADAPTERS)('the outbox on the pool option, over %s', (adapter: AdapterName) => {
  let pool: pg.Pool;
  let app: INestApplication;
  const delivered: string[] = [];

  beforeAll(async () => {
    pool = poolOn(await freshSchema(`pool_option_outbox_${adapter}`));
    app = await start([IdempotencyModule.forRoot({ pool, migrate: true, outbox: {}, tenant, sweep: false })], adapter, [
      OrdersController,
    ]);
    app.get(OutboxRelay).handle<{ id: string }>('order.created', async (message) => void delivered.push(message.payload.id));
  });
  afterAll(async () => {
    await app?.close();
    await pool?.end();
  });

  it('enqueues in the key’s transaction, rolls the message back with a failing handler, and relays what committed', async () => {
    expect((await post(urlOf(app), '/orders', { id: 'kept' }, `k-kept-${adapter}`)).status).toBe(201);
    expect((await post(urlOf(app), '/orders', { id: 'undone', fail: true }, `k-undone-${adapter}`)).status).toBe(500);

    const report = await app.get(OutboxRelay).relayOnce();

    expect(report).toMatchObject({ claimed: 1, delivered: 1 });
    expect(delivered).toEqual(['kept']);
  });
});

describe('the pool option, refused', () => {
  let schema: string;
  let pool: pg.Pool;

  beforeAll(async () => {
    schema = await freshSchema('pool_option_refused');
    pool = poolOn(schema);
    await migrateIdempotencyTables(pool);
  });
  afterAll(async () => {
    await pool?.end();
  });

  it('beside dataSource', () => {
    expect(() => IdempotencyModule.forRoot({ pool, dataSource: 'other', tenant })).toThrow(IdempotencyConfigurationError);
  });

  it('as idempotentPool(pool), which is the ORM’s', () => {
    expect(() => IdempotencyModule.forRoot({ pool: idempotentPool(pool), tenant })).toThrow(/not idempotentPool\(pool\)/);
  });

  it('migrate: true on a TypeORM data source, saying what to do instead', async () => {
    await expect(
      start(
        [
          // Never connected: the module refuses before it would use the data source.
          TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0, manualInitialization: true }),
          IdempotencyModule.forRoot({ tenant, migrate: true, sweep: false }),
        ],
        'express',
      ),
    ).rejects.toThrow(/migratingDataSourceFactory/);
  });

  it('migrateIdempotencyTables applies each migration once', async () => {
    expect(await migrateIdempotencyTables(pool)).toEqual([]);
    expect(await migrateIdempotencyTables(pool, { outboxTableName: 'outbox_messages' })).toEqual([
      'CreateOutboxMessages1764547200000',
    ]);
    const { rows } = await pool.query('SELECT name FROM nest_idempotency_migrations ORDER BY name');
    expect(rows.map((row: { name: string }) => row.name)).toEqual([
      'CreateIdempotencyKeys1764460800000',
      'CreateOutboxMessages1764547200000',
    ]);
  });
});
