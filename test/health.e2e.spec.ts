import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Get, Injectable, Module, Query, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { ScheduleModule } from '@nestjs/schedule';
import { HealthCheck, HealthCheckService, TerminusModule, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { InjectDataSource, TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import type { DataSource } from 'typeorm';
import { HEALTH_PROBE_TENANT, IdempotencyHealthIndicator, IdempotencyHealthModule } from '../src/health/index.js';
import { IdempotencyModule, IdempotencySweeper, PostgresIdempotencyStore, type IdempotencyModuleOptions } from '../src/index.js';
import { IdempotencyStore, type SweepOptions, type SweepResult } from '../src/store/index.js';
import { createOutboxTable, createTables, dataSourceOptions, freshSchema, QueryCounter, sqlClient } from './support/database.js';
import { send } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

/** The module's own store, with a sweep that can be made to fail (a fault of the store, not of the database). */
@Injectable()
class FaultableStore extends PostgresIdempotencyStore {
  sweepFailure?: Error;
  constructor(@InjectDataSource() dataSource: DataSource) {
    super(dataSource, 'idempotency_keys');
  }
  override sweep(options: SweepOptions): Promise<SweepResult> {
    return this.sweepFailure ? Promise.reject(this.sweepFailure) : super.sweep(options);
  }
}

@Controller('health')
class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly database: TypeOrmHealthIndicator,
    private readonly idempotency: IdempotencyHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check(@Query('timeout') timeout?: string, @Query('maxExpiredBacklog') maxExpiredBacklog?: string) {
    return this.health.check([
      () => this.database.pingCheck('database'),
      () =>
        this.idempotency.isHealthy('idempotency', {
          timeout: timeout ? Number(timeout) : undefined,
          maxExpiredBacklog: maxExpiredBacklog ? Number(maxExpiredBacklog) : undefined,
        }),
    ]);
  }
}

interface HealthApp {
  app: INestApplication;
  url: string;
  store: FaultableStore;
  queries: QueryCounter;
}

async function startHealthApp(
  adapter: AdapterName,
  schema: string,
  options: Partial<IdempotencyModuleOptions>,
): Promise<HealthApp> {
  const queries = new QueryCounter();
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema, { logger: queries }), retryAttempts: 0 }),
      ScheduleModule.forRoot(),
      IdempotencyModule.forRoot({ tenant: () => 'health', store: FaultableStore, sweep: false, ...options }),
      TerminusModule,
      IdempotencyHealthModule,
    ],
    controllers: [HealthController],
  })
  class HealthTestModule {}
  const app =
    adapter === 'express'
      ? await NestFactory.create(HealthTestModule, new ExpressAdapter(), { logger: false, abortOnError: false })
      : await NestFactory.create(HealthTestModule, new FastifyAdapter(), { logger: false, abortOnError: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, store: app.get(IdempotencyStore) as FaultableStore, queries };
}

/** Rows the sweeper would delete (`expired`), or would not (`leased`: TTL over, lease still valid). */
async function seedKeys(db: pg.Client, prefix: string, count: number, kind: 'expired' | 'leased'): Promise<void> {
  const lease = kind === 'leased' ? "now() + interval '1 minute'" : "now() - interval '1 second'";
  await db.query(
    `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor)
     SELECT 'tenant', $1 || g, 'fp', 'in_flight', gen_random_uuid(), ${lease}, now() - interval '1 second', now() - interval '1 second'
       FROM generate_series(1, $2::int) AS g`,
    [prefix, count],
  );
}

describe.each(ADAPTERS)('IdempotencyHealthIndicator over %s', (adapter) => {
  let api: HealthApp;
  let db: pg.Client;
  let schema: string;
  const health = async (query = '') => {
    const res = await send(api.url, 'GET', `/health${query}`);
    return { status: res.status, body: res.json() };
  };

  beforeAll(async () => {
    schema = await freshSchema(`health_${adapter}`);
    await createTables(schema);
    await createOutboxTable(schema);
    api = await startHealthApp(adapter, schema, { outbox: {} });
    db = await sqlClient(schema);
  });
  afterEach(async () => {
    api.store.sweepFailure = undefined;
    await db.query('DELETE FROM idempotency_keys');
    await db.query('DELETE FROM outbox_messages');
  });
  afterAll(async () => {
    await api?.app.close();
    await db?.end();
  });

  it('is up when the store answers a claim: the probe claims in the reserved tenant and gives the claim back', async () => {
    api.queries.reset();
    const { status, body } = await health();
    expect(status).toBe(200);
    expect(body.status).toBe('ok');
    expect(body.info.idempotency).toMatchObject({
      status: 'up',
      store: { status: 'up', responseTimeMs: expect.any(Number) },
      sweeper: { status: 'up', scheduled: false, lastRun: null, expiredBacklog: 0 },
      outbox: { status: 'up', deadLetters: 0 },
    });
    const statements = api.queries.queries.filter((q) => q.startsWith('/* nest-idempotency:')).map((q) => q.split(' */')[0]);
    expect(statements).toEqual(expect.arrayContaining(['/* nest-idempotency:claim', '/* nest-idempotency:release']));
    const left = await db.query('SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = $1', [HEALTH_PROBE_TENANT]);
    expect(left.rows[0].n).toBe(0);
  });

  it('is down when the claim path fails although the database answers SELECT 1', async () => {
    await db.query('ALTER FUNCTION idempotency_keys_claim RENAME TO idempotency_keys_claim_off');
    try {
      const { status, body } = await health();
      expect(status).toBe(503);
      expect(body.info.database.status).toBe('up');
      expect(body.error.idempotency).toMatchObject({ status: 'down', store: { status: 'down' } });
      expect(body.error.idempotency.store.message).toContain('idempotency_keys_claim');
    } finally {
      await db.query('ALTER FUNCTION idempotency_keys_claim_off RENAME TO idempotency_keys_claim');
    }
    expect((await health()).status).toBe(200);
  });

  it('is down when the claim does not answer within the timeout', async () => {
    const blocker = await sqlClient(schema);
    try {
      await blocker.query('BEGIN');
      await blocker.query('LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE');
      const { status, body } = await health('?timeout=300');
      expect(status).toBe(503);
      expect(body.error.idempotency.store).toMatchObject({ status: 'down', message: 'No answer within 300 ms.' });
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    expect((await health()).status).toBe(200);
  });

  it('is degraded (still 200) when the expired backlog reaches its limit; a sweep clears it', async () => {
    await seedKeys(db, 'expired-', 5, 'expired');
    // Expired, but its lease runs: never swept, never counted.
    await seedKeys(db, 'leased-', 3, 'leased');
    const backed = await health('?maxExpiredBacklog=5');
    expect(backed.status).toBe(200);
    expect(backed.body.status).toBe('degraded');
    expect(backed.body.info.idempotency.sweeper).toMatchObject({ status: 'degraded', expiredBacklog: 5 });
    expect(backed.body.info.idempotency.sweeper.message).toContain('At least 5 expired keys');
    expect((await health('?maxExpiredBacklog=6')).body.info.idempotency.sweeper).toMatchObject({
      status: 'up',
      expiredBacklog: 5,
    });

    await api.app.get(IdempotencySweeper).runOnce();
    const swept = await health('?maxExpiredBacklog=5');
    expect(swept.body.status).toBe('ok');
    expect(swept.body.info.idempotency.sweeper).toMatchObject({
      status: 'up',
      expiredBacklog: 0,
      lastRun: { ran: true, deleted: 5, failed: false, finishedAt: expect.any(String) },
    });
  });

  it("is degraded when the sweeper's last run failed", async () => {
    api.store.sweepFailure = new Error('sweep exploded');
    await api.app.get(IdempotencySweeper).runOnce();
    const { status, body } = await health();
    expect(status).toBe(200);
    expect(body.info.idempotency.sweeper).toMatchObject({ status: 'degraded', lastRun: { failed: true, ran: false } });
    expect(body.info.idempotency.sweeper.message).toBe('The last sweep failed: sweep exploded');
    api.store.sweepFailure = undefined;
    await api.app.get(IdempotencySweeper).runOnce();
    expect((await health()).body.info.idempotency.sweeper.status).toBe('up');
  });

  it('is degraded while the outbox holds dead letters; redriving them clears it', async () => {
    await db.query(`INSERT INTO outbox_messages (topic, payload, status, attempts) VALUES ('receipt', '{}', 'dead', 10)`);
    await db.query(`INSERT INTO outbox_messages (topic, payload, status) VALUES ('receipt', '{}', 'delivered')`);
    const dead = await health();
    expect(dead.status).toBe(200);
    expect(dead.body.status).toBe('degraded');
    expect(dead.body.info.idempotency.outbox).toMatchObject({ status: 'degraded', deadLetters: 1 });
    expect(dead.body.info.idempotency.outbox.message).toContain('1 outbox message is dead-lettered');
    await db.query(`UPDATE outbox_messages SET status = 'pending' WHERE status = 'dead'`);
    expect((await health()).body.info.idempotency.outbox).toEqual({ status: 'up', deadLetters: 0 });
  });
});

describe('IdempotencyHealthIndicator.report() and the sweeper schedule', () => {
  let api: HealthApp;

  beforeAll(async () => {
    const schema = await freshSchema('health_schedule');
    await createTables(schema);
    // Scheduled, but far apart: no run happens during the test.
    api = await startHealthApp('express', schema, { sweep: { interval: '1h', maxDuration: '1s' } });
  });
  afterEach(() => {
    jest.useRealTimers();
  });
  afterAll(async () => {
    await api?.app.close();
  });

  it('reports without Terminus, and leaves the outbox out when it is not configured', async () => {
    const report = await api.app.get(IdempotencyHealthIndicator).report();
    expect(report).toEqual({
      status: 'up',
      store: { status: 'up', responseTimeMs: expect.any(Number) },
      sweeper: { status: 'up', scheduled: true, lastRun: null, expiredBacklog: 0 },
    });
  });

  it('is degraded once a scheduled sweeper has missed more than a tick', async () => {
    // Only the clock moves: two intervals and the run's budget after the app started, and a bit.
    const later = Date.now() + 2 * 3_600_000 + 1_000 + 60_000;
    jest.useFakeTimers({
      now: later,
      doNotFake: [
        'hrtime',
        'nextTick',
        'performance',
        'queueMicrotask',
        'requestAnimationFrame',
        'cancelAnimationFrame',
        'requestIdleCallback',
        'cancelIdleCallback',
        'setImmediate',
        'clearImmediate',
        'setInterval',
        'clearInterval',
        'setTimeout',
        'clearTimeout',
      ],
    });
    const report = await api.app.get(IdempotencyHealthIndicator).report();
    expect(report.status).toBe('degraded');
    expect(report.sweeper.status).toBe('degraded');
    expect(report.sweeper.message).toMatch(/^The sweeper has not finished a run for \d+ s\.$/);
  });
});

describe('IdempotencyHealthIndicator comes from IdempotencyHealthModule, not from IdempotencyModule', () => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function create(schema: string, feature: { isGlobal: boolean; health: 'none' | 'provider' }) {
    @Module({
      imports: [IdempotencyModule.forRoot({ tenant: () => 'health', sweep: false, isGlobal: feature.isGlobal })],
      providers: feature.health === 'provider' ? [IdempotencyHealthIndicator] : [],
    })
    class FeatureModule {}
    @Module({ imports: [TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }), FeatureModule] })
    class RootModule {}
    return NestFactory.create(RootModule, new ExpressAdapter(), { logger: false, abortOnError: false });
  }

  it('IdempotencyModule alone provides no health indicator', async () => {
    const schema = await freshSchema('health_without_module');
    await createTables(schema);
    app = await create(schema, { isGlobal: true, health: 'none' });
    expect(() => app!.get(IdempotencyHealthIndicator)).toThrow();
  });

  it('with isGlobal: false, the indicator works as a provider of the module that imports IdempotencyModule', async () => {
    const schema = await freshSchema('health_not_global');
    await createTables(schema);
    app = await create(schema, { isGlobal: false, health: 'provider' });
    await app.init();
    expect(await app.get(IdempotencyHealthIndicator).report()).toMatchObject({ status: 'up', store: { status: 'up' } });
  });
});
