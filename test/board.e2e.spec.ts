import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Controller,
  Injectable,
  Module,
  Param,
  Post,
  type CanActivate,
  type ExecutionContext,
  type INestApplication,
  type LoggerService,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import type { EntityManager, Logger as TypeOrmLogger } from 'typeorm';
import { boardKey } from '../src/board/board-key.js';
import { BoardProblemType, IdempotencyBoardModule, type BoardScope } from '../src/board/index.js';
import { IdempotencyConfigurationError, Idempotent, IdempotencyModule, IdempotencyService, TxManager } from '../src/index.js';
import { createOutboxTable, createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { send, sleep, type RawResponse } from './support/http.js';
import { keyTableKind, keyTableOptions } from './support/key-table.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

/** Handlers held open until the test lets them go: a key stays in flight meanwhile. */
@Injectable()
class Gates {
  private readonly open = new Map<string, () => void>();
  private readonly waiting = new Map<string, Promise<void>>();
  runs = new Map<string, number>();

  hold(label: string): void {
    this.waiting.set(label, new Promise((resolve) => this.open.set(label, resolve)));
  }
  release(label: string): void {
    this.open.get(label)?.();
  }
  /** Only a label's first run waits at its gate: a retry that takes the key over runs through. */
  async pass(label: string): Promise<void> {
    const run = (this.runs.get(label) ?? 0) + 1;
    this.runs.set(label, run);
    if (run === 1) await this.waiting.get(label);
  }
}

@Controller('work')
class WorkController {
  constructor(private readonly gates: Gates) {}

  @Post(':label')
  @Idempotent()
  async work(@Param('label') label: string, @TxManager() tx: EntityManager) {
    // The effect is written first, then the handler waits: a released attempt's write must roll back.
    await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['board', label]);
    await this.gates.pass(label);
    return { label };
  }

  @Post('fail/:label')
  @Idempotent()
  fail(): never {
    throw new Error('the handler failed');
  }
}

/** The app's operator guard: `X-Operator: admin` sees every tenant, `X-Operator: tenant:<t>` one tenant. */
@Injectable()
class OperatorGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const operator = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-operator'];
    return operator === 'admin' || (operator?.startsWith('tenant:') ?? false) || operator === 'nobody-scope';
  }
}

function operatorScope(context: ExecutionContext): BoardScope | undefined {
  const operator = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-operator'];
  if (operator === 'admin') return { allTenants: true };
  if (operator?.startsWith('tenant:')) return { tenant: operator.slice('tenant:'.length) };
  return undefined;
}

class CapturingLogger implements LoggerService {
  lines: string[] = [];
  log(message: unknown) {
    this.lines.push(String(message));
  }
  warn(message: unknown) {
    this.lines.push(`WARN ${String(message)}`);
  }
  error(message: unknown) {
    this.lines.push(`ERROR ${String(message)}`);
  }
}

/** TypeORM's query logging, switched on, every line kept: what an app with `logging: 'all'` would write. */
class QueryLog implements TypeOrmLogger {
  lines: string[] = [];
  logQuery(query: string, parameters?: unknown[]) {
    this.lines.push(`${query} ${JSON.stringify(parameters ?? [])}`);
  }
  logQueryError(error: string | Error, query: string, parameters?: unknown[]) {
    this.lines.push(`ERROR ${String(error)} ${query} ${JSON.stringify(parameters ?? [])}`);
  }
  logQuerySlow(time: number, query: string, parameters?: unknown[]) {
    this.lines.push(`SLOW ${query} ${JSON.stringify(parameters ?? [])}`);
  }
  logSchemaBuild() {}
  logMigration() {}
  log(_level: string, message: unknown) {
    this.lines.push(String(message));
  }
}

async function startBoardApp(
  adapter: AdapterName,
  schema: string,
  boards: Array<Parameters<typeof IdempotencyBoardModule.forRoot>[0]>,
  logger: LoggerService | false = false,
  lease = 3_000,
  globalPrefix?: string,
  queryLogger?: TypeOrmLogger,
): Promise<{ app: INestApplication; url: string }> {
  @Module({
    imports: [
      TypeOrmModule.forRoot({
        ...dataSourceOptions(schema, queryLogger ? { logger: queryLogger, logging: 'all' } : {}),
        retryAttempts: 0,
      }),
      IdempotencyModule.forRoot({
        tenant: (context) => context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'],
        sweep: false,
        outbox: { relay: false },
        // Short, so that the heartbeat (a third of it) notices a release soon in the same-instance case.
        lease,
        ...keyTableOptions(),
      }),
      ...boards.map((board) => IdempotencyBoardModule.forRoot(board)),
    ],
    controllers: [WorkController],
    providers: [Gates, OperatorGuard],
  })
  class BoardTestModule {}
  const app =
    adapter === 'express'
      ? await NestFactory.create(BoardTestModule, new ExpressAdapter(), { logger, abortOnError: false })
      : await NestFactory.create(BoardTestModule, new FastifyAdapter(), { logger, abortOnError: false });
  if (globalPrefix) app.setGlobalPrefix(globalPrefix);
  await app.listen(0, '127.0.0.1');
  return { app, url: (await app.getUrl()).replace('[::1]', '127.0.0.1') };
}

/** What the board's page gives a browser: the token in its meta element and the cookie that must come with it. */
async function operatorSession(url: string, operator: string, path = '/board') {
  const page = await send(url, 'GET', path, { headers: [['X-Operator', operator]] });
  expect(page.status).toBe(200);
  const token = /<meta name="board-csrf" content="([^"]+)">/.exec(page.text())?.[1];
  const cookie = String(page.headers['set-cookie']).split(';')[0];
  expect(token).toBeDefined();
  const headers = (extra: Array<[string, string]> = []): Array<[string, string]> => [
    ['X-Operator', operator],
    ['Cookie', cookie],
    ['X-Board-Csrf', token!],
    ['Sec-Fetch-Site', 'same-origin'],
    ...extra,
  ];
  return {
    get: (api: string) => send(url, 'GET', `${path}/api/${api}`, { headers: [['X-Operator', operator]] }),
    post: (api: string, body: unknown, extra?: Array<[string, string]>) =>
      send(url, 'POST', `${path}/api/${api}`, { headers: headers(extra), body }),
    page,
    token: token!,
    cookie,
  };
}

const work = (url: string, label: string, key: string, tenant: string) =>
  send(url, 'POST', `/work/${label}`, {
    headers: [
      ['X-Tenant', tenant],
      ['Idempotency-Key', key],
    ],
    body: {},
  });

function problemOf(res: RawResponse) {
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  return res.json<{ type: string; status: number; detail: string }>();
}

describe('IdempotencyBoardModule at start-up', () => {
  it('refuses to start without a guard, and says how to fix it', () => {
    expect(() => IdempotencyBoardModule.forRoot({ path: 'board' })).toThrow(IdempotencyConfigurationError);
    expect(() => IdempotencyBoardModule.forRoot({ path: 'board' })).toThrow(/guard: YourAdminGuard.*unguarded: true/s);
  });

  it('refuses a path it cannot mount', () => {
    expect(() => IdempotencyBoardModule.forRoot({ path: '../x y', unguarded: true })).toThrow(/the path the board is mounted at/);
  });

  it('runs unguarded only when asked, and logs a warning that says so', async () => {
    const schema = await freshSchema('board_unguarded');
    await createTables(schema);
    await createOutboxTable(schema);
    const logger = new CapturingLogger();
    const { app, url } = await startBoardApp('express', schema, [{ path: 'open-board', unguarded: true }], logger);
    try {
      expect(logger.lines.some((line) => line.startsWith('WARN') && /open-board runs without a guard/.test(line))).toBe(true);
      expect((await send(url, 'GET', '/open-board/api/overview')).status).toBe(200);
    } finally {
      await app.close();
    }
  });

  it('never writes a key into the logs, with TypeORM query logging on', async () => {
    const schema = await freshSchema('board_logs');
    await createTables(schema);
    await createOutboxTable(schema);
    const log = new QueryLog();
    const { app, url } = await startBoardApp(
      'express',
      schema,
      [{ path: 'board', unguarded: true }],
      false,
      3_000,
      undefined,
      log,
    );
    const key = 'board-secret-key-7f3a9c';
    try {
      const db = await sqlClient(schema);
      try {
        await db.query(
          `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor)
           VALUES ('tenant-a', $1, 'fp', 'in_flight', gen_random_uuid(), now() - interval '1 second', now() + interval '1 day',
                   now() + interval '1 day')`,
          [key],
        );
      } finally {
        await db.end();
      }
      const session = await operatorSession(url, 'admin');
      expect((await session.post('lookup', { tenant: 'tenant-a', key })).status).toBe(200);
      const { keys } = (await session.get('stuck')).json();
      expect((await session.post('stuck/release', { tenant: 'tenant-a', ref: keys[0].ref })).status).toBe(200);
      expect(log.lines.some((line) => line.includes('board-lookup'))).toBe(true);
      expect(log.lines.filter((line) => line.includes(key))).toEqual([]);
    } finally {
      await app.close();
    }
  });

  it.each(ADAPTERS)("addresses its assets and API below the app's global prefix (%s)", async (adapter) => {
    const schema = await freshSchema(`board_prefix_${adapter}`);
    await createTables(schema);
    await createOutboxTable(schema);
    const { app, url } = await startBoardApp(adapter, schema, [{ path: 'board', unguarded: true }], false, 3_000, 'api/v1');
    try {
      const page = await send(url, 'GET', '/api/v1/board');
      expect(page.status).toBe(200);
      expect(page.text()).toContain('<script src="/api/v1/board/assets/board.js" defer></script>');
      expect(page.text()).toContain('<meta name="board-base" content="/api/v1/board">');
      expect(String(page.headers['set-cookie'])).toContain('Path=/api/v1/board;');
      expect((await send(url, 'GET', '/api/v1/board/assets/board.js')).status).toBe(200);
      expect((await send(url, 'GET', '/api/v1/board/api/overview')).status).toBe(200);
    } finally {
      await app.close();
    }
  });
});

describe.each(ADAPTERS)('IdempotencyBoardModule over %s', (adapter) => {
  let url: string;
  let app: INestApplication;
  let db: pg.Client;
  let gates: Gates;
  let peer: INestApplication;
  let peerUrl: string;
  let peerGates: Gates;
  let schema: string;

  beforeAll(async () => {
    schema = await freshSchema(`board_${adapter}`);
    await createTables(schema);
    await createOutboxTable(schema);
    if (keyTableKind() === 'partitioned') {
      // A partition for the days before today (the migration makes them from today on), which a scan reads before
      // today's: an earlier use of a key then sits where a lookup without an order would find it first.
      const setup = await sqlClient(schema);
      await setup.query(`DO $$ DECLARE today timestamptz := date_bin('1 day', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00');
        BEGIN EXECUTE format('CREATE TABLE idempotency_keys_earlier PARTITION OF idempotency_keys FOR VALUES FROM (%L) TO (%L)',
                             today - interval '3 days', today); END $$`);
      await setup.end();
    }
    ({ app, url } = await startBoardApp(adapter, schema, [
      { path: 'board', guard: OperatorGuard, scope: operatorScope },
      { path: 'admin/board-with-bodies', guard: new OperatorGuard(), scope: operatorScope, showBodies: true },
    ]));
    gates = app.get(Gates);
    // A second instance of the app on the same database, with a board of its own.
    ({ app: peer, url: peerUrl } = await startBoardApp(adapter, schema, [
      { path: 'board', guard: OperatorGuard, scope: operatorScope },
    ]));
    peerGates = peer.get(Gates);
    db = await sqlClient(schema);
  });
  /** A request of tenant-a held inside its handler, and the stuck keys an admin's board lists meanwhile. */
  async function hungAttempt(labelPrefix: string, keyPrefix: string) {
    const label = `${labelPrefix}-${Date.now()}`;
    const key = `${keyPrefix}-${label}`;
    gates.hold(label);
    const original = work(url, label, key, 'tenant-a');
    while ((gates.runs.get(label) ?? 0) < 1) await sleep(10);
    const admin = await operatorSession(url, 'admin');
    const { keys } = (await admin.get('stuck')).json();
    return { label, key, original, admin, keys };
  }

  afterEach(async () => {
    await db.query('DELETE FROM idempotency_keys');
    await db.query('DELETE FROM outbox_messages');
    await db.query('DELETE FROM effects');
  });
  afterAll(async () => {
    await app?.close();
    await peer?.close();
    await db?.end();
  });

  it("refuses every page, asset and call without the app guard's consent", async () => {
    for (const path of [
      '/board',
      '/board/assets/board.js',
      '/board/api/overview',
      '/board/api/stuck',
      '/board/api/dead-letters',
    ]) {
      expect((await send(url, 'GET', path)).status).toBe(403);
    }
    expect((await send(url, 'POST', '/board/api/lookup', { body: { tenant: 't', key: 'k' } })).status).toBe(403);
    // Admitted by the guard, but the scope function has no answer for this operator: refused, never widened.
    const unscoped = await send(url, 'GET', '/board/api/overview', { headers: [['X-Operator', 'nobody-scope']] });
    expect(unscoped.status).toBe(403);
    expect(problemOf(unscoped).type).toBe(BoardProblemType.forbidden);
  });

  it('serves a page with no inline script, a strict policy, and an HttpOnly SameSite token cookie', async () => {
    const page = await send(url, 'GET', '/board', { headers: [['X-Operator', 'admin']] });
    expect(page.headers['content-type']).toMatch(/^text\/html/);
    expect(page.headers['content-security-policy']).toMatch(/script-src 'self';/);
    expect(page.headers['content-security-policy']).not.toMatch(/unsafe-inline/);
    expect(page.headers['cache-control']).toBe('no-store');
    expect(page.text()).not.toMatch(/<script(?![^>]*\ssrc=)/);
    expect(page.text()).not.toMatch(/\son[a-z]+=|\sstyle=/);
    expect(String(page.headers['set-cookie'])).toMatch(
      /^idempotency_board_csrf=[A-Za-z0-9_-]{43}; Path=\/board; HttpOnly; SameSite=Strict$/,
    );
    const script = await send(url, 'GET', '/board/assets/board.js', { headers: [['X-Operator', 'admin']] });
    expect(script.status).toBe(200);
    expect(script.headers['content-type']).toMatch(/^text\/javascript/);
    expect(() => new Function(script.text())).not.toThrow();
    const styles = await send(url, 'GET', '/board/assets/board.css', { headers: [['X-Operator', 'admin']] });
    expect(styles.headers['content-type']).toMatch(/^text\/css/);
    // A second board mounted deeper: its assets are addressed from its own path.
    const deeper = await send(url, 'GET', '/admin/board-with-bodies', { headers: [['X-Operator', 'admin']] });
    expect(deeper.text()).toContain('src="/admin/board-with-bodies/assets/board.js"');
  });

  it('counts keys by state per tenant and charts the outcomes of its own events', async () => {
    const label = `count-${Date.now()}`;
    expect((await work(url, `${label}-a`, 'key-completed-1', 'tenant-a')).status).toBe(201);
    expect((await work(url, `${label}-a`, 'key-completed-1', 'tenant-a')).headers['idempotent-replayed']).toBe('true');
    expect((await work(url, `${label}-b`, 'key-completed-2', 'tenant-b')).status).toBe(201);
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor)
       VALUES ('tenant-b', 'expired-1', 'fp', 'completed', gen_random_uuid(), now() - interval '2 days', now() - interval '1 hour',
               now() - interval '1 hour'),
              ('tenant-b', 'stale-1', 'fp', 'in_flight', gen_random_uuid(), now() - interval '1 minute', now() + interval '1 day',
               now() + interval '1 day')`,
    );
    const admin = await operatorSession(url, 'admin');
    const overview = (await admin.get('overview')).json();
    expect(overview.keys.totals).toEqual({ inFlight: 1, leasePassed: 1, completed: 2, expired: 1 });
    expect(overview.keys.tenants).toEqual(
      expect.arrayContaining([
        { tenant: 'tenant-a', inFlight: 0, leasePassed: 0, completed: 1, expired: 0 },
        { tenant: 'tenant-b', inFlight: 1, leasePassed: 1, completed: 1, expired: 1 },
      ]),
    );
    expect(overview.outbox).toEqual({ pending: 0, retrying: 0, dead: 0 });
    const minutes = overview.outcomes.perMinute as Array<Record<string, number | string>>;
    expect(minutes).toHaveLength(60);
    const route = (overview.outcomes.perRoute as Array<Record<string, number | string>>).find(
      (r) => r.route === 'WorkController.work',
    );
    // Named as a request names it, with the handler the events name beside it.
    expect(route).toMatchObject({ label: 'POST /work/:label', executed: expect.any(Number), replayed: expect.any(Number) });
    const before = { executed: route!.executed as number, replayed: route!.replayed as number };
    await work(url, `${label}-a`, 'key-completed-1', 'tenant-a');
    const after = (await admin.get('overview')).json();
    const routeAfter = after.outcomes.perRoute.find((r: { route: string }) => r.route === 'WorkController.work');
    expect(routeAfter).toMatchObject({ executed: before.executed, replayed: before.replayed + 1 });
    expect(after.outcomes.perMinute[59].replayed).toBeGreaterThanOrEqual(1);
  });

  it("charts a handler's 500 under its own name (5xx, key kept), per minute and per route, never as 'other'", async () => {
    const admin = await operatorSession(url, 'admin');
    const keptBefore = (await admin.get('overview'))
      .json()
      .outcomes.perMinute.reduce((n: number, m: { kept: number }) => n + m.kept, 0);
    const failed = await send(url, 'POST', `/work/fail/f-${Date.now()}`, {
      headers: [
        ['X-Tenant', 'tenant-a'],
        ['Idempotency-Key', `fail-${Date.now()}`],
      ],
      body: {},
    });
    expect(failed.status).toBe(500);
    const { outcomes } = (await admin.get('overview')).json();
    expect(outcomes.perMinute.reduce((n: number, m: { kept: number }) => n + m.kept, 0)).toBe(keptBefore + 1);
    const route = outcomes.perRoute.find((r: { route: string }) => r.route === 'WorkController.fail');
    expect(route).toMatchObject({ kept: 1, executed: 0, 'failure-stored': 0, released: 0, error: 0 });
    expect(route).not.toHaveProperty('other');
    const script = await send(url, 'GET', '/board/assets/board.js', { headers: [['X-Operator', 'admin']] });
    expect(script.text()).toContain("kept: '5xx, key kept'");
  });

  it("shows a scoped operator one tenant's keys and outcomes, nothing of another tenant", async () => {
    const before = (await (await operatorSession(url, 'tenant:tenant-a')).get('overview')).json();
    const executedBefore = before.outcomes.perMinute.reduce((n: number, m: { executed: number }) => n + m.executed, 0);
    await work(url, 'scoped-a', 'key-a', 'tenant-a');
    await work(url, 'scoped-b', 'key-b', 'tenant-b');
    await work(url, 'scoped-b2', 'key-b2', 'tenant-b');
    const operator = await operatorSession(url, 'tenant:tenant-a');
    const overview = (await operator.get('overview')).json();
    expect(overview.scope).toEqual({ tenant: 'tenant-a' });
    expect(overview.keys.tenants.map((t: { tenant: string }) => t.tenant)).toEqual(['tenant-a']);
    expect(overview.keys.totals.completed).toBe(1);
    const executed = overview.outcomes.perMinute.reduce((n: number, m: { executed: number }) => n + m.executed, 0);
    expect(executed - executedBefore).toBe(1);
    expect(JSON.stringify(overview)).not.toContain('tenant-b');
  });

  it('lists a hung attempt as stuck; a release lets the next retry run at once and fences the released attempt', async () => {
    const { label, key, original, admin, keys } = await hungAttempt('hung', 'stuck-key');
    expect(keys).toHaveLength(1);
    expect(keys[0]).toMatchObject({ tenant: 'tenant-a', key: boardKey(key), attempt: 1, leasePassed: false });
    expect(keys[0].key).toMatch(new RegExp(`^stuc…\\d{4} \\(${key.length}\\) #[0-9a-f]{6}$`));
    expect(JSON.stringify(keys)).not.toContain(key);
    // Before the release, a retry is a 409 on either instance: the attempt holds its lease (renewed by its heartbeat).
    await sleep(1_200);
    expect((await work(peerUrl, label, key, 'tenant-a')).status).toBe(409);

    const released = await admin.post('stuck/release', { tenant: 'tenant-a', ref: keys[0].ref });
    expect(released.status).toBe(200);
    expect(released.json()).toEqual({ released: true });
    // The same release again: that attempt no longer holds the key.
    expect(problemOf(await admin.post('stuck/release', { tenant: 'tenant-a', ref: keys[0].ref })).type).toBe(
      BoardProblemType.gone,
    );

    // Another instance's retry takes the key over at once and runs, while the released attempt still hangs.
    const retry = await work(peerUrl, label, key, 'tenant-a');
    expect(retry.status).toBe(201);
    expect(peerGates.runs.get(label)).toBe(1);
    // The released attempt, let go, loses its completion to the fence: its write rolls back, its client gets 409.
    gates.release(label);
    const first = await original;
    expect(first.status).toBe(409);
    expect(problemOf(first).type).toMatch(/lease-lost/);
    const { rows } = await db.query('SELECT count(*)::int AS n FROM effects WHERE label = $1', [label]);
    expect(rows[0].n).toBe(1);
    const row = (await db.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0];
    expect(row).toEqual({ status: 'completed', attempt: 2 });
  });

  it('lets a retry on the instance of the released attempt run at once when that instance released it', async () => {
    const { label, key, original, admin, keys } = await hungAttempt('hung-here', 'stuck-here');
    expect((await admin.post('stuck/release', { tenant: 'tenant-a', ref: keys[0].ref })).status).toBe(200);
    // The board told its own process: no duplicate here is answered 409 from memory any more.
    expect((await work(url, label, key, 'tenant-a')).status).toBe(201);
    gates.release(label);
    expect((await original).status).toBe(409);
    const { rows } = await db.query('SELECT count(*)::int AS n FROM effects WHERE label = $1', [label]);
    expect(rows[0].n).toBe(1);
  });

  it("lets it run within a heartbeat when another instance's board released it", async () => {
    const { label, key, original, keys } = await hungAttempt('hung-there', 'stuck-there');
    const elsewhere = await operatorSession(peerUrl, 'admin');
    expect((await elsewhere.post('stuck/release', { tenant: 'tenant-a', ref: keys[0].ref })).status).toBe(200);
    // Within one heartbeat (a third of the 3 s lease) this instance stops answering its own duplicates 409.
    const startedAt = Date.now();
    let retry = await work(url, label, key, 'tenant-a');
    while (retry.status === 409 && Date.now() - startedAt < 3_000) {
      await sleep(100);
      retry = await work(url, label, key, 'tenant-a');
    }
    expect(retry.status).toBe(201);
    expect(Date.now() - startedAt).toBeLessThan(2_500);
    gates.release(label);
    expect((await original).status).toBe(409);
    const { rows } = await db.query('SELECT count(*)::int AS n FROM effects WHERE label = $1', [label]);
    expect(rows[0].n).toBe(1);
  });

  it('refuses actions without the anti-forgery token, from another site, or with a token of another cookie', async () => {
    const admin = await operatorSession(url, 'admin');
    const ref = '00000000-0000-4000-8000-000000000000';
    const body = { tenant: 'tenant-a', ref };
    const bare = await send(url, 'POST', '/board/api/stuck/release', { headers: [['X-Operator', 'admin']], body });
    expect(problemOf(bare).type).toBe(BoardProblemType.csrf);
    const noCookie = await send(url, 'POST', '/board/api/stuck/release', {
      headers: [
        ['X-Operator', 'admin'],
        ['X-Board-Csrf', admin.token],
      ],
      body,
    });
    expect(problemOf(noCookie).type).toBe(BoardProblemType.csrf);
    const crossSite = await admin.post('stuck/release', body, [['Sec-Fetch-Site', 'cross-site']]);
    expect(crossSite.status).toBe(403);
    const other = await operatorSession(url, 'admin');
    const mixed = await send(url, 'POST', '/board/api/stuck/release', {
      headers: [
        ['X-Operator', 'admin'],
        ['Cookie', other.cookie],
        ['X-Board-Csrf', admin.token],
      ],
      body,
    });
    expect(problemOf(mixed).type).toBe(BoardProblemType.csrf);
    // With the token, the request reaches the release (which finds no such attempt).
    expect(problemOf(await admin.post('stuck/release', body)).type).toBe(BoardProblemType.gone);
    expect(problemOf(await admin.post('stuck/release', { tenant: 'tenant-a', ref: 'not-a-uuid' })).status).toBe(400);
  });

  it("never lets a scoped operator see or release another tenant's key", async () => {
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor)
       VALUES ('tenant-b', 'b-stuck', 'fp', 'in_flight', '11111111-1111-4111-8111-111111111111', now() - interval '1 minute', now() + interval '1 day',
               now() + interval '1 day'),
              ('tenant-a', 'a-stuck', 'fp', 'in_flight', '22222222-2222-4222-8222-222222222222', now() - interval '1 minute', now() + interval '1 day',
               now() + interval '1 day')`,
    );
    const operator = await operatorSession(url, 'tenant:tenant-a');
    const { keys } = (await operator.get('stuck')).json();
    expect(keys.map((k: { tenant: string }) => k.tenant)).toEqual(['tenant-a']);
    const ref = '11111111-1111-4111-8111-111111111111';
    expect((await operator.post('stuck/release', { tenant: 'tenant-b', ref })).status).toBe(404);
    expect((await operator.post('stuck/release', { ref })).status).toBe(409);
    const untouched = await db.query(`SELECT owner_token FROM idempotency_keys WHERE key = 'b-stuck'`);
    expect(untouched.rows[0].owner_token).toBe(ref);
    expect((await operator.post('lookup', { tenant: 'tenant-b', key: 'b-stuck' })).status).toBe(404);
    expect((await operator.post('lookup', { key: 'b-stuck' })).status).toBe(404);
    expect((await operator.post('lookup', { key: 'a-stuck' })).json()).toMatchObject({
      tenant: 'tenant-a',
      state: 'lease-passed',
      leaseExpiresAt: expect.any(String),
    });
  });

  it('lists two stuck keys alike but for one character so that they read apart, never in full', async () => {
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor)
       VALUES ('tenant-a', 'err-1', 'fp', 'in_flight', gen_random_uuid(), now() - interval '1 minute', now() + interval '1 day',
               now() + interval '1 day'),
              ('tenant-a', 'err-2', 'fp', 'in_flight', gen_random_uuid(), now() - interval '2 minutes', now() + interval '1 day',
               now() + interval '1 day')`,
    );
    const admin = await operatorSession(url, 'admin');
    const listed = (await admin.get('stuck')).json().keys.map((k: { key: string }) => k.key);
    expect(listed).toHaveLength(2);
    expect(new Set(listed).size).toBe(2);
    expect([...listed].sort()).toEqual([
      expect.stringMatching(/^e…1 \(5\) #[0-9a-f]{6}$/),
      expect.stringMatching(/^e…2 \(5\) #[0-9a-f]{6}$/),
    ]);
    // The lookup names a key as the list does, so an operator can match the two.
    expect(listed).toContain((await admin.post('lookup', { tenant: 'tenant-a', key: 'err-1' })).json().key);
  });

  it('looks a key up by tenant and key, with its stored body only where the board shows bodies', async () => {
    const label = `lookup-${Date.now()}`;
    expect((await work(url, label, 'lookup-key-1', 'tenant-a')).status).toBe(201);
    const admin = await operatorSession(url, 'admin');
    const found = await admin.post('lookup', { tenant: 'tenant-a', key: 'lookup-key-1' });
    expect(found.status).toBe(200);
    expect(found.json()).toMatchObject({
      tenant: 'tenant-a',
      key: boardKey('lookup-key-1'),
      state: 'completed',
      attempt: 1,
      responseStatus: 201,
      completedAt: expect.any(String),
      // A completed key has no lease to show.
      leaseExpiresAt: null,
    });
    expect(found.json().response).toBeUndefined();
    expect(found.text()).not.toContain(label);
    expect((await admin.post('lookup', { tenant: 'tenant-b', key: 'lookup-key-1' })).status).toBe(404);

    const withBodies = await operatorSession(url, 'admin', '/admin/board-with-bodies');
    const shown = (await withBodies.post('lookup', { tenant: 'tenant-a', key: 'lookup-key-1' })).json();
    expect(shown.response).toMatchObject({ bodyEncoding: 'utf8', truncated: false });
    expect(JSON.parse(shown.response.body)).toEqual({ label });
  });

  it('answers the rest of the overview when counting the key table takes too long, and says so', async () => {
    // Another session holds the key table: the board's count waits for it until its statement timeout.
    const locker = await sqlClient(schema);
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE');
      const admin = await operatorSession(url, 'admin');
      const startedAt = Date.now();
      const overview = await admin.get('overview');
      expect(overview.status).toBe(200);
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(4_500);
      expect(overview.json().keys).toEqual({ unavailable: expect.stringMatching(/did not answer within 5000 ms/) });
      expect(overview.json().outbox).toEqual({ pending: 0, retrying: 0, dead: 0 });
    } finally {
      await locker.query('ROLLBACK');
      await locker.end();
    }
  });

  it('finds keys that IdempotencyService.execute stored, whatever characters they hold', async () => {
    const service = app.get(IdempotencyService);
    const admin = await operatorSession(url, 'admin');
    for (const key of ['nightly report 2026-12-01', 'clé de remboursement ✓', 'k'.repeat(400)]) {
      await service.execute({ tenant: 'tenant-a', key, payload: { run: 1 } }, () => ({ done: true }));
      const found = await admin.post('lookup', { tenant: 'tenant-a', key });
      expect({ key, status: found.status, state: found.json().state }).toEqual({ key, status: 200, state: 'completed' });
    }
  });

  it("shows a key's latest use, not an earlier expired one the table still holds", async () => {
    const key = `reused-${Date.now()}`;
    // An earlier use, two days old and past its TTL (on the partitioned table it stays in its old partition).
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, attempt, lease_expires_at,
                                     expires_at, expiry_floor, created_at, completed_at, response_status)
       VALUES ('tenant-a', $1, 'earlier', 'completed', gen_random_uuid(), 3, now() - interval '2 days',
               now() - interval '1 day', now() - interval '1 day', now() - interval '2 days', now() - interval '2 days', 500)`,
      [key],
    );
    expect((await work(url, `reuse-${Date.now()}`, key, 'tenant-a')).status).toBe(201);
    const admin = await operatorSession(url, 'admin');
    const found = (await admin.post('lookup', { tenant: 'tenant-a', key })).json();
    expect(found).toMatchObject({ state: 'completed', responseStatus: 201, attempt: 1 });
  });

  it('answers malformed lookups and actions with a 400 problem, never a 500', async () => {
    const admin = await operatorSession(url, 'admin');
    const cases: Array<[string, unknown]> = [
      ['lookup', { tenant: 'tenant-a', key: 'has\u0000nul' }],
      ['lookup', { tenant: 'tenant-a', key: '' }],
      ['lookup', { tenant: 'tenant-a', key: 42 }],
      ['lookup', { tenant: 'nul\u0000tenant', key: 'k' }],
      ['stuck/release', { tenant: 'tenant-a', ref: "x' OR 1=1 --" }],
      ['stuck/release', { tenant: ['tenant-a'], ref: '00000000-0000-4000-8000-000000000000' }],
      ['dead-letters/redrive', { ids: ['1 OR 1=1'] }],
      ['dead-letters/redrive', { ids: ['99999999999999999999'] }],
      // 19 digits, past bigint's 9223372036854775807.
      ['dead-letters/redrive', { ids: ['9999999999999999999'] }],
      ['dead-letters/redrive', { ids: [] }],
    ];
    for (const [action, body] of cases) {
      const res = await admin.post(action, body);
      expect({ action, body, status: res.status, type: problemOf(res).type }).toEqual({
        action,
        body,
        status: 400,
        type: BoardProblemType.badRequest,
      });
    }
    const rawJson = await send(url, 'POST', '/board/api/lookup', {
      headers: [
        ['X-Operator', 'admin'],
        ['Cookie', admin.cookie],
        ['X-Board-Csrf', admin.token],
      ],
      rawBody: '{"tenant": "tenant-a", "key": ',
    });
    // The app's body parser answers these itself (Express's strict JSON refuses a bare string): a 400 all the same.
    expect(rawJson.status).toBe(400);
    expect((await admin.post('lookup', 'not an object')).status).toBe(400);
  });

  it('lists dead letters with their last error, and redrives one, then all, within the scope', async () => {
    await db.query(
      `INSERT INTO outbox_messages (tenant_id, topic, payload, status, attempts, last_error)
       VALUES ('tenant-a', 'receipt', '{}', 'dead', 5, 'SMTP 550'), ('tenant-a', 'receipt', '{}', 'dead', 5, 'timeout'),
              ('tenant-b', 'receipt', '{}', 'dead', 5, 'b failed'), ('tenant-a', 'receipt', '{}', 'pending', 2, NULL)`,
    );
    const operator = await operatorSession(url, 'tenant:tenant-a');
    const listed = (await operator.get('dead-letters')).json();
    expect(listed.configured).toBe(true);
    expect(listed.messages.map((m: { lastError: string }) => m.lastError).sort()).toEqual(['SMTP 550', 'timeout']);
    expect((await operator.get('overview')).json().outbox).toEqual({ pending: 0, retrying: 1, dead: 2 });

    const one = await operator.post('dead-letters/redrive', { ids: [listed.messages[0].id] });
    expect(one.json()).toEqual({ redriven: 1 });
    const row = await db.query('SELECT status, attempts, last_error FROM outbox_messages WHERE id = $1', [listed.messages[0].id]);
    expect(row.rows[0]).toEqual({ status: 'pending', attempts: 0, last_error: null });

    expect((await operator.post('dead-letters/redrive', { all: true })).json()).toEqual({ redriven: 1 });
    const dead = await db.query(`SELECT tenant_id FROM outbox_messages WHERE status = 'dead'`);
    expect(dead.rows).toEqual([{ tenant_id: 'tenant-b' }]);
    expect((await operator.post('dead-letters/redrive', {})).status).toBe(400);
  });
});
