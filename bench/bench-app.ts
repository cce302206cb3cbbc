/**
 * The app under load, run by the bench runner in a child process of its own
 * (so the load generator does not share its event loop). Env: DATABASE_URL,
 * BENCH_SCHEMA, HTTP_ADAPTER (`express` | `fastify`), BENCH_POOL_SIZE,
 * BENCH_RESERVED_CONNECTIONS (the module's `reservedConnections`; its default
 * when unset), BENCH_SERVICE_URL (the slow service of the realistic handler),
 * BENCH_PREPARED_STATEMENTS.
 *
 * Every charges route runs the same handler (`createCharge`: one INSERT, same
 * SQL); only what surrounds it differs:
 *   POST /bare/charges   the handler opens a TypeORM transaction itself; no module
 *   POST /idem/charges   @Idempotent(): the module claims, opens the transaction, completes
 *   POST /idem-rt/charges  @Idempotent({ claimMode: 'request-transaction' }): claim inside the transaction
 *   POST /floor/charges  the module's protocol written by hand on pg (its own claim and completion SQL),
 *                        in 3 round trips: `BEGIN; claim; COMMIT; BEGIN`, the INSERT, `complete; COMMIT`
 *   POST /idem-memory/charges  @Idempotent({ replayFromMemory: true }): completed keys replayed from memory
 *   POST /floor-async-claim/charges  the same, with the claim committed asynchronously (an earlier version's choice)
 *   POST /floor-rt/charges  claim mode request-transaction's protocol written by hand (its success path)
 *   POST /floor-5rt/charges  the earlier protocol, one statement per round trip (claim, BEGIN, INSERT, complete, COMMIT)
 *   POST /floor-prepared/charges  that one with claim and completion as named prepared statements
 *   POST /floor-memory/charges  a replay from memory by hand (HandWrittenMemoryReplay), around the nodb handler
 *   POST /nodb/charges   no database work at all (it waits `delayMs` when given, as the handler does)
 * The realistic routes run `createRealisticCharge` (a read, three inserts
 * and a call to the slow service, all inside the transaction):
 *   POST /bare/realistic   in a plain TypeORM transaction; no module
 *   POST /idem/realistic   @Idempotent()
 * The data layers' routes (/prisma-bare, /prisma-idem, /drizzle-bare, /drizzle-idem) are in layer-routes.ts.
 */
import 'reflect-metadata';
import {
  BadRequestException,
  Body,
  ConflictException,
  Controller,
  Headers,
  Injectable,
  Module,
  Post,
  Req,
  Res,
  UnprocessableEntityException,
  UseInterceptors,
  type CallHandler,
  type ExecutionContext,
  type INestApplication,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost, NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { getDataSourceToken, InjectDataSource, TypeOrmModule } from '@nestjs/typeorm';
import { createHook } from 'node:async_hooks';
import { createHash, randomUUID } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { of, tap, type Observable } from 'rxjs';
import type { DataSource, EntityManager, Logger as TypeOrmLogger } from 'typeorm';
import { DEFAULT_LEASE_MS, DEFAULT_TTL_MS } from '../src/idempotency.constants.js';
import { keyStoreStatements } from '../src/store/key-store.sql.js';
import { requestTransactionKeyStatements } from '../src/store/request-transaction-key.sql.js';
import { FENCE_LOST_SQLSTATE } from '../src/store/key-function-parts.sql.js';
import { pipelined } from '../src/store/postgres/pipelined.js';
import type { PipelineClient, PipelinedStatement } from '../src/store/postgres/pipeline-types.js';
import { quoteTableName } from '../src/store/identifiers.js';
import { Idempotent, IdempotencyModule, TxManager } from '../src/index.js';
import { chargeView, type ChargeBody } from './charge.js';
import { LayerChargesController, layerRoutes } from './layer-routes.js';
import { BENCH_TENANT, CHARGES_TABLE, CUSTOMERS_TABLE, EVENTS_TABLE, KEY_TABLE, LEDGER_TABLE, onCitus } from './database.js';
import {
  APP_APPLICATION_NAME,
  type AppEvent,
  type AppReply,
  type PoolPeak,
  type RunnerRequest,
  type WithoutId,
} from './protocol.js';

type Rows = Array<Record<string, unknown>>;
type Query = (sql: string, params: unknown[]) => Promise<Rows>;

const TENANT = BENCH_TENANT;
const INSERT_CHARGE = `INSERT INTO ${CHARGES_TABLE} (amount, currency, customer) VALUES ($1, $2, $3) RETURNING id, created_at`;

/** The one handler body every route shares: insert a charge, then answer its view. */
async function createCharge(query: Query, body: ChargeBody) {
  const [row] = await query(INSERT_CHARGE, [body.amount, body.currency, body.customer]);
  if (body.delayMs) await sleep(body.delayMs);
  return chargeView(String(row.id), row.created_at as Date, body);
}

const SELECT_CUSTOMER = `SELECT id, risk_level FROM ${CUSTOMERS_TABLE} WHERE id = $1`;
const INSERT_LEDGER_ENTRY = `INSERT INTO ${LEDGER_TABLE} (charge_id, customer_id, amount) VALUES ($1, $2, $3)`;
const INSERT_EVENT = `INSERT INTO ${EVENTS_TABLE} (charge_id, type, provider_reference) VALUES ($1, $2, $3)`;

/**
 * A handler closer to a real one: read the customer, insert the charge, ask
 * another service (the slow local one, about 5 ms) to authorize it while
 * the transaction stays open, then record a ledger entry and an event.
 */
async function createRealisticCharge(query: Query, body: ChargeBody, serviceUrl: string) {
  const [customer] = await query(SELECT_CUSTOMER, [body.customer]);
  if (!customer) throw new BadRequestException(`Unknown customer ${body.customer}`);
  const [row] = await query(INSERT_CHARGE, [body.amount, body.currency, body.customer]);
  const response = await fetch(serviceUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ charge: String(row.id), amount: body.amount, currency: body.currency }),
  });
  if (!response.ok) throw new Error(`The slow service answered ${response.status}`);
  const authorization = (await response.json()) as { id: string };
  await query(INSERT_LEDGER_ENTRY, [row.id, customer.id, body.amount]);
  await query(INSERT_EVENT, [row.id, 'charge.succeeded', authorization.id]);
  return chargeView(String(row.id), row.created_at as Date, body);
}

/**
 * Counts the round trips the app makes, only while the runner asks (those of
 * one request): one entry per round trip. The store pipelines several
 * statements into one round trip (logged one by one, all in one turn of the
 * event loop before they are sent): statements logged in the same turn are one
 * entry, joined with `; `. A multi-statement simple query (the floor's
 * `BEGIN; ...; COMMIT; BEGIN`) is one message and one answer, logged once.
 */
class RoundTripCounter implements TypeOrmLogger {
  private recording?: string[];
  private turnOpen = false;
  start(): void {
    this.recording = [];
  }
  stop(): string[] {
    const queries = this.recording ?? [];
    this.recording = undefined;
    return queries.map((entry) => entry.slice(0, 160));
  }
  record(query: string): void {
    if (!this.recording) return;
    const text = query.replace(/\s+/g, ' ').trim().slice(0, 80);
    if (this.turnOpen && this.recording.length > 0) {
      this.recording[this.recording.length - 1] += `; ${text}`;
      return;
    }
    this.recording.push(text);
    this.turnOpen = true;
    setImmediate(() => (this.turnOpen = false));
  }
  logQuery(query: string): void {
    this.record(query);
  }
  logQueryError(): void {}
  logQuerySlow(): void {}
  logSchemaBuild(): void {}
  logMigration(): void {}
  log(): void {}
}

/**
 * Peak use of the pg Pool under TypeORM's postgres driver. Sampled when a
 * connection is asked for (that is when the wait queue grows) and when one is
 * handed out (when in-use peaks), so no peak slips between timer ticks.
 */
class PoolWatch {
  private peak?: PoolPeak;

  constructor(private readonly pool: pg.Pool) {
    const connect = pool.connect.bind(pool) as (...args: unknown[]) => unknown;
    (pool as unknown as { connect: (...args: unknown[]) => unknown }).connect = (...args: unknown[]) => {
      const result = connect(...args);
      this.sample();
      return result;
    };
    pool.on('acquire', () => this.sample());
  }

  get max(): number {
    return (this.pool as unknown as { options: { max: number } }).options.max;
  }

  now(): { inUse: number; waiting: number } {
    return { inUse: this.pool.totalCount - this.pool.idleCount, waiting: this.pool.waitingCount };
  }

  start(): void {
    this.peak = { max: this.max, total: 0, inUse: 0, waiting: 0 };
    this.sample();
  }

  stop(): PoolPeak {
    const peak = this.peak ?? { max: this.max, total: 0, inUse: 0, waiting: 0 };
    this.peak = undefined;
    return peak;
  }

  private sample(): void {
    if (!this.peak) return;
    const { totalCount, idleCount, waitingCount } = this.pool;
    this.peak.total = Math.max(this.peak.total, totalCount);
    this.peak.inUse = Math.max(this.peak.inUse, totalCount - idleCount);
    this.peak.waiting = Math.max(this.peak.waiting, waitingCount);
  }
}

/** The pg Pool TypeORM's postgres driver keeps in `driver.master`; checked, since that is not public API. */
function driverPool(dataSource: DataSource): pg.Pool {
  const pool = (dataSource.driver as unknown as { master?: unknown }).master as pg.Pool | undefined;
  if (!pool || typeof pool.connect !== 'function' || typeof pool.totalCount !== 'number') {
    throw new Error('TypeORM postgres driver: `driver.master` is not a pg Pool; the bench must find the pool another way.');
  }
  return pool;
}

/** SQL text, or a named prepared statement (pg parses and plans it once per connection). */
type Statement = string | { name: string; text: string };
type ClaimRow = { state: string; response_status: number | null; response_body: Buffer | null };

/**
 * How the floor talks to PostgreSQL:
 * - `roundTrips: 3` is the module's new-key protocol, statement for statement:
 *   the claim alone (its own transaction, each value a parameter, as the store
 *   sends it), `START TRANSACTION` and the handler's INSERT in one batch, then
 *   the fenced completion and `COMMIT` pipelined the same way (node-postgres
 *   8.23). `asyncClaimCommit` is an earlier version's protocol: `BEGIN`, `SET
 *   LOCAL synchronous_commit TO off`, the claim, `COMMIT` and `START
 *   TRANSACTION` in one socket write (the business COMMIT that follows flushes
 *   the claim's WAL).
 * - `inTransaction` is claim mode `request-transaction`'s protocol on the plain
 *   table: `START TRANSACTION` and `claim_in_transaction` pipelined, the
 *   handler's INSERT, then `complete_in_transaction` (which writes the key's
 *   row, completed, and takes back the key's lock the claim held for its
 *   session) and `COMMIT` pipelined. Only its success path is written: a
 *   failure after the claim would have to let go of that session hold.
 * - `roundTrips: 5` is the earlier protocol, one statement per round trip (claim,
 *   BEGIN, INSERT, completion, COMMIT); `prepared` sends claim and completion as
 *   named prepared statements, which only the extended protocol can carry.
 */
type FloorProtocol =
  { roundTrips: 3; asyncClaimCommit: boolean } | { roundTrips: 5; prepared: boolean } | { roundTrips: 3; inTransaction: true };

type Outcome = { replayed: boolean; status: number; value: object };

/**
 * The floor: what a careful developer would write by hand on pg, with the
 * library's own claim and completion statements (read from the store, so they
 * cannot drift), the same insert, and the same transactions, on one pooled
 * client. "module / floor" compares equal protocols, so it measures the
 * module's own layers and nothing else.
 */
class HandWrittenIdempotency {
  private readonly claimSql: string;
  private readonly completeSql: string;
  private readonly completeOrRaiseSql: string;
  private readonly claimInTransactionSql: string;
  private readonly completeInTransactionSql: string;

  constructor(
    private readonly pool: pg.Pool,
    private readonly counter: RoundTripCounter,
  ) {
    const statements = keyStoreStatements(quoteTableName(KEY_TABLE), KEY_TABLE);
    this.claimSql = expectParameters(statements.claim, 7, 'claim');
    this.completeSql = expectParameters(statements.complete, 7, 'complete');
    this.completeOrRaiseSql = expectParameters(statements.completeOrRaise, 7, 'completeOrRaise');
    const inTransaction = requestTransactionKeyStatements(quoteTableName(KEY_TABLE), KEY_TABLE);
    this.claimInTransactionSql = expectParameters(inTransaction.claimInTransaction, 7, 'claimInTransaction');
    this.completeInTransactionSql = expectParameters(inTransaction.completeInTransaction, 8, 'completeInTransaction');
  }

  run(key: string, fingerprint: string, work: (query: Query) => Promise<object>, protocol: FloorProtocol): Promise<Outcome> {
    const ownerToken = randomUUID();
    const claimParams = [TENANT, key, fingerprint, ownerToken, DEFAULT_LEASE_MS, DEFAULT_TTL_MS, null];
    const complete = (value: object) => {
      const stored = Buffer.from(JSON.stringify(value), 'utf8');
      const headers = JSON.stringify([['content-type', 'application/json; charset=utf-8']]);
      return [TENANT, key, ownerToken, 201, headers, stored, DEFAULT_TTL_MS];
    };
    if ('inTransaction' in protocol) {
      const [tenant, , , owner, , ttl] = claimParams;
      // complete_in_transaction: tenant, key, fingerprint, owner, then status, headers, body, ttl as complete's.
      const completeInTransaction = (value: object) => {
        const [, , , status, headers, body] = complete(value);
        return [tenant, key, fingerprint, owner, status, headers, body, ttl];
      };
      return this.runInRequestTransaction([...claimParams.slice(0, 6), 0], completeInTransaction, work);
    }
    return protocol.roundTrips === 3
      ? this.runInThreeRoundTrips(claimParams, complete, work, protocol.asyncClaimCommit)
      : this.runInFiveRoundTrips(claimParams, complete, work, protocol.prepared);
  }

  private async runInRequestTransaction(
    claimParams: unknown[],
    completeParams: (value: object) => unknown[],
    work: (query: Query) => Promise<object>,
  ): Promise<Outcome> {
    const client = await this.pool.connect();
    let broken: Error | undefined;
    try {
      const [, claimed] = await this.pipeline(client, [
        { text: 'START TRANSACTION' },
        { text: this.claimInTransactionSql, values: claimParams },
      ]);
      const row = claimed?.rows[0] as ClaimRow | undefined;
      if (row?.state !== 'claimed') {
        // The claim held nothing for its session unless it claimed: the transaction's end lets go of the rest.
        await this.message(client, 'ROLLBACK');
        return answerWithoutWork(row);
      }
      const value = await work((sql, params) => this.query(client, sql, params));
      await this.pipeline(client, [{ text: this.completeInTransactionSql, values: completeParams(value) }, { text: 'COMMIT' }]);
      return { replayed: false, status: 201, value };
    } catch (error) {
      // The floor writes the success path only: a connection left holding the key for its session is not pooled again.
      broken = error as Error;
      if ((error as { code?: string }).code === FENCE_LOST_SQLSTATE) throw new ConflictException('Lease lost');
      throw error;
    } finally {
      client.release(broken);
    }
  }

  private async runInThreeRoundTrips(
    claimParams: unknown[],
    completeParams: (value: object) => unknown[],
    work: (query: Query) => Promise<object>,
    asyncClaimCommit: boolean,
  ): Promise<Outcome> {
    const client = await this.pool.connect();
    // Known to be outside any transaction block (committed or rolled back): nothing to roll back on an error.
    let settled = false;
    let broken: Error | undefined;
    try {
      if (!asyncClaimCommit) {
        // As the store sends it: the claim alone, its own transaction (duplicates on other connections must see it),
        // then the business transaction's BEGIN written ahead of the handler's first statement, in one batch.
        const [claimed] = await this.pipeline(client, [{ text: this.claimSql, values: claimParams }]);
        const row = claimed?.rows[0] as ClaimRow | undefined;
        if (row?.state !== 'claimed') {
          settled = true;
          return answerWithoutWork(row);
        }
        let begun = false;
        const value = await work(async (sql, params) => {
          if (begun) return this.query(client, sql, params);
          begun = true;
          const [, answer] = await this.pipeline(client, [{ text: 'START TRANSACTION' }, { text: sql, values: params }]);
          return Object.assign(answer.rows as Rows, { rowCount: (answer as { rowCount?: number | null }).rowCount ?? null });
        });
        const completion = { text: this.completeOrRaiseSql, values: completeParams(value) };
        await this.pipeline(client, [...(begun ? [] : [{ text: 'START TRANSACTION' }]), completion, { text: 'COMMIT' }]);
        settled = true;
        return { replayed: false, status: 201, value };
      }
      // The earlier protocol: the claim in a transaction of its own whose COMMIT need not wait for its flush
      // (SET LOCAL lasts for that transaction only), and the business transaction's BEGIN, in one round trip.
      const claimStatements: PipelinedStatement[] = [
        { text: 'BEGIN ISOLATION LEVEL READ COMMITTED' },
        ...(asyncClaimCommit ? [{ text: 'SET LOCAL synchronous_commit TO off' }] : []),
        { text: this.claimSql, values: claimParams },
        { text: 'COMMIT' },
        { text: 'START TRANSACTION' },
      ];
      const results = await this.pipeline(client, claimStatements);
      const row = results[asyncClaimCommit ? 2 : 1]?.rows[0] as ClaimRow | undefined;
      if (row?.state !== 'claimed') {
        await this.message(client, 'ROLLBACK');
        settled = true;
        return answerWithoutWork(row);
      }
      const value = await work((sql, params) => this.query(client, sql, params));
      // The completion raises when its fence fails, so the COMMIT after it answers ROLLBACK.
      await this.pipeline(client, [{ text: this.completeOrRaiseSql, values: completeParams(value) }, { text: 'COMMIT' }]);
      settled = true;
      return { replayed: false, status: 201, value };
    } catch (error) {
      // Whatever failed (the claim, the handler, the fence), an open or aborted transaction is rolled back.
      if (!settled) await client.query('ROLLBACK').catch((rollbackError: Error) => (broken = rollbackError));
      if ((error as { code?: string }).code === FENCE_LOST_SQLSTATE) throw new ConflictException('Lease lost');
      throw error;
    } finally {
      // A client whose ROLLBACK failed is in an unknown state: pg discards it rather than pooling it.
      client.release(broken);
    }
  }

  /**
   * @param prepared send the claim and the completion as named prepared
   *   statements (parsed and planned once per connection), to measure what
   *   re-planning them on every request costs. The library itself cannot do
   *   this behind PgBouncer < 1.21 in transaction pooling.
   */
  private async runInFiveRoundTrips(
    claimParams: unknown[],
    completeParams: (value: object) => unknown[],
    work: (query: Query) => Promise<object>,
    prepared: boolean,
  ): Promise<Outcome> {
    const claimSql: Statement = prepared ? { name: 'bench_claim', text: this.claimSql } : this.claimSql;
    const completeSql: Statement = prepared ? { name: 'bench_complete', text: this.completeSql } : this.completeSql;
    const [claim] = await this.query(this.pool, claimSql, claimParams);
    const row = claim as ClaimRow | undefined;
    if (row?.state !== 'claimed') return answerWithoutWork(row);

    const client = await this.pool.connect();
    try {
      await this.query(client, 'BEGIN', []);
      const value = await work((sql, params) => this.query(client, sql, params));
      const [completed] = (await this.query(client, completeSql, completeParams(value))) as Array<{ completed?: boolean }>;
      if (completed?.completed !== true) throw new ConflictException('Lease lost');
      await this.query(client, 'COMMIT', []);
      return { replayed: false, status: 201, value };
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }

  /** Rows of a statement; for an UPDATE the array also carries pg's `rowCount`. */
  private async query(on: pg.Pool | pg.PoolClient, sql: Statement, params: unknown[]): Promise<Rows> {
    this.counter.record(typeof sql === 'string' ? sql : sql.text);
    const result = typeof sql === 'string' ? await on.query(sql, params) : await on.query({ ...sql, values: params });
    return Object.assign(result.rows, { rowCount: result.rowCount });
  }

  /**
   * One simple-protocol message (pg sends a query without values that way), which may
   * hold several statements: pg answers one result per statement. Counted once, since
   * it is one round trip.
   */
  private async message(client: pg.PoolClient, sql: string): Promise<pg.QueryResult[]> {
    this.counter.record(sql);
    const result = (await client.query(sql)) as pg.QueryResult | pg.QueryResult[];
    return Array.isArray(result) ? result : [result];
  }

  /** Statements pipelined in one round trip, as the store sends them; the first error is thrown once all have answered. */
  private async pipeline(client: pg.PoolClient, statements: PipelinedStatement[]): Promise<Array<{ rows: unknown[] }>> {
    for (const statement of statements) this.counter.record(statement.text);
    const results = await pipelined(client as unknown as PipelineClient, statements);
    const failed = results.find((result) => !result.ok);
    if (failed && !failed.ok) throw failed.error;
    return results.map((result) => (result.ok ? result : { rows: [] }));
  }
}

/** The answer to a claim that did not claim: a replay, or the 422 / 409 the module would send. */
function answerWithoutWork(row: ClaimRow | undefined): Outcome {
  if (row?.state === 'completed') {
    return {
      replayed: true,
      status: row.response_status ?? 200,
      value: JSON.parse(row.response_body!.toString('utf8')) as object,
    };
  }
  if (row?.state === 'mismatch') throw new UnprocessableEntityException('Idempotency-Key reused with another request');
  throw new ConflictException('Idempotency-Key in flight');
}

function expectParameters(sql: string | undefined, count: number, name: string): string {
  const highest = Math.max(0, ...[...(sql ?? '').matchAll(/\$(\d+)/g)].map((m) => Number(m[1])));
  if (!sql || highest !== count) {
    throw new Error(
      `keyStoreStatements().${name} changed (expected ${count} parameters, found ${highest}); update the bench floor.`,
    );
  }
  return sql;
}

function handWrittenFingerprint(method: string, url: string, body: unknown): string {
  return createHash('sha256')
    .update(`${method} ${url}\n${JSON.stringify(body)}`)
    .digest('hex');
}

type FloorRequest = { method: string; url: string };

/**
 * A replay from memory written by hand, the least such a replay can cost inside Nest: an interceptor reads the key,
 * finds the answer this process completed in a Map (checked against a hash of the method, path and body), sets the
 * replay's status and header and hands the stored value to Nest, which serializes and sends it. Nothing bounds the
 * Map or expires it, and nothing stands between concurrent duplicates: a floor, not an implementation.
 */
@Injectable()
class HandWrittenMemoryReplay implements NestInterceptor {
  private readonly answers = new Map<string, { fingerprint: string; value: unknown }>();

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const http = context.switchToHttp();
    const request = http.getRequest<FloorRequest & { headers: Record<string, string | undefined>; body: unknown }>();
    const key = request.headers['idempotency-key'];
    if (!key) throw new BadRequestException('Idempotency-Key is required');
    const fingerprint = handWrittenFingerprint(request.method, request.url, request.body);
    const known = this.answers.get(key);
    if (known) {
      if (known.fingerprint !== fingerprint) throw new UnprocessableEntityException('Another request used this key');
      const { httpAdapter } = this.adapterHost;
      httpAdapter.setHeader(http.getResponse(), 'Idempotent-Replayed', 'true');
      httpAdapter.status(http.getResponse(), 201);
      return of(known.value);
    }
    return next.handle().pipe(tap((value) => this.answers.set(key, { fingerprint, value })));
  }
}
/** The floor sets the replay's status and header itself and lets Nest send its return value. */
const PASS = { passthrough: true };

@Controller()
class ChargesController {
  constructor(
    @InjectDataSource() private readonly dataSource: DataSource,
    private readonly handWritten: HandWrittenIdempotency,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  @Post('bare/charges')
  bare(@Body() body: ChargeBody) {
    return this.dataSource.transaction((manager) => createCharge((sql, params) => manager.query(sql, params), body));
  }

  @Post('idem/charges')
  @Idempotent()
  idempotent(@Body() body: ChargeBody, @TxManager() manager: EntityManager) {
    return createCharge((sql, params) => manager.query(sql, params), body);
  }

  @Post('idem-memory/charges')
  @Idempotent({ replayFromMemory: true })
  idempotentReplayedFromMemory(@Body() body: ChargeBody, @TxManager() manager: EntityManager) {
    return createCharge((sql, params) => manager.query(sql, params), body);
  }

  @Post('idem-rt/charges')
  @Idempotent({ claimMode: 'request-transaction' })
  idempotentInRequestTransaction(@Body() body: ChargeBody, @TxManager() manager: EntityManager) {
    return createCharge((sql, params) => manager.query(sql, params), body);
  }

  @Post('bare/realistic')
  bareRealistic(@Body() body: ChargeBody) {
    return this.dataSource.transaction((manager) =>
      createRealisticCharge((sql, params) => manager.query(sql, params), body, serviceUrl()),
    );
  }

  @Post('idem/realistic')
  @Idempotent()
  idempotentRealistic(@Body() body: ChargeBody, @TxManager() manager: EntityManager) {
    return createRealisticCharge((sql, params) => manager.query(sql, params), body, serviceUrl());
  }

  @Post('floor/charges')
  floor(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
    @Req() request: FloorRequest,
    @Res(PASS) reply: unknown,
  ) {
    return this.handWrittenCharge(body, key, request, reply, { roundTrips: 3, asyncClaimCommit: false });
  }

  @Post('floor-async-claim/charges')
  floorAsyncClaim(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
    @Req() request: FloorRequest,
    @Res(PASS) reply: unknown,
  ) {
    return this.handWrittenCharge(body, key, request, reply, { roundTrips: 3, asyncClaimCommit: true });
  }

  @Post('floor-rt/charges')
  floorRequestTransaction(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
    @Req() request: FloorRequest,
    @Res(PASS) reply: unknown,
  ) {
    return this.handWrittenCharge(body, key, request, reply, { roundTrips: 3, inTransaction: true });
  }

  @Post('floor-5rt/charges')
  floorFiveRoundTrips(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
    @Req() request: FloorRequest,
    @Res(PASS) reply: unknown,
  ) {
    return this.handWrittenCharge(body, key, request, reply, { roundTrips: 5, prepared: false });
  }

  @Post('floor-prepared/charges')
  floorPrepared(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
    @Req() request: FloorRequest,
    @Res(PASS) reply: unknown,
  ) {
    return this.handWrittenCharge(body, key, request, reply, { roundTrips: 5, prepared: true });
  }

  private async handWrittenCharge(
    body: ChargeBody,
    key: string | undefined,
    request: FloorRequest,
    response: unknown,
    protocol: FloorProtocol,
  ) {
    if (!key) throw new BadRequestException('Idempotency-Key is required');
    const fingerprint = handWrittenFingerprint(request.method, request.url, body);
    const outcome = await this.handWritten.run(key, fingerprint, (query) => createCharge(query, body), protocol);
    if (outcome.replayed) {
      this.adapterHost.httpAdapter.setHeader(response, 'Idempotent-Replayed', 'true');
      this.adapterHost.httpAdapter.status(response, outcome.status);
    }
    return outcome.value;
  }

  @Post('floor-memory/charges')
  @UseInterceptors(HandWrittenMemoryReplay)
  async memoryFloor(@Body() body: ChargeBody) {
    return chargeView('0', new Date(), body);
  }

  @Post('nodb/charges')
  async noDatabase(@Body() body: ChargeBody) {
    // The storms' baseline sends the module's delay too, so both routes hold each request as long.
    if (body.delayMs) await sleep(body.delayMs);
    return chargeView('0', new Date(), body);
  }
}

/**
 * Promises the app has created, counted when `BENCH_COUNT_PROMISES=1` (bench:profile): a count per request that
 * does not move with the machine's load, beside CPU figures that do. The hook costs CPU of its own on every
 * promise, so CPU figures of such a run read high.
 */
const promisesCreated = process.env.BENCH_COUNT_PROMISES === '1' ? countPromises() : undefined;

function countPromises(): () => number {
  let created = 0;
  createHook({
    init(_id, type) {
      if (type === 'PROMISE') created++;
    },
  }).enable();
  return () => created;
}

function createBenchModule(counter: RoundTripCounter) {
  const schema = process.env.BENCH_SCHEMA ?? 'bench';
  const poolSize = Number(process.env.BENCH_POOL_SIZE ?? 10);
  const layers = layerRoutes(schema, poolSize);
  @Module({
    imports: [
      TypeOrmModule.forRoot({
        type: 'postgres',
        url: process.env.DATABASE_URL,
        schema,
        applicationName: APP_APPLICATION_NAME,
        // The claim is plain SQL on the key table, so it resolves through search_path.
        extra: {
          options: `-c search_path=${schema}`,
          max: poolSize,
          connectionTimeoutMillis: 10_000,
        },
        logger: counter,
        retryAttempts: 0,
      }),
      // BENCH_PREPARED_STATEMENTS=1 measures the module's opt-in prepared claim and completion.
      IdempotencyModule.forRoot({
        tenant: () => TENANT,
        sweep: false,
        citus: onCitus(),
        preparedStatements: process.env.BENCH_PREPARED_STATEMENTS === '1',
        // The replayFromMemory variant's keys are made once and replayed for the whole run: they must outlive it.
        completedAnswers: { window: '2h' },
        // Scenario 10 also runs with 0 (claims share the business pool) to show what the reserved pool buys.
        ...(process.env.BENCH_RESERVED_CONNECTIONS
          ? { reservedConnections: Number(process.env.BENCH_RESERVED_CONNECTIONS) }
          : {}),
      }),
      ...layers.imports,
    ],
    controllers: [ChargesController, LayerChargesController],
    providers: [
      ...layers.providers,
      {
        provide: HandWrittenIdempotency,
        useFactory: (dataSource: DataSource) => new HandWrittenIdempotency(driverPool(dataSource), counter),
        inject: [getDataSourceToken()],
      },
    ],
  })
  class BenchModule {}
  return BenchModule;
}

function serviceUrl(): string {
  const url = process.env.BENCH_SERVICE_URL;
  if (!url) throw new Error('BENCH_SERVICE_URL is not set: the runner starts the slow service and passes its URL.');
  return url;
}

/** Room for scenario 11's ~1 MiB bodies on both adapters (Express parses 100 kB by default, Fastify 1 MiB). */
const BODY_LIMIT_BYTES = 4 * 1024 * 1024;

/** Room for a storm's 1000 simultaneous connects: Node's default accept backlog is 511. */
const LISTEN_BACKLOG = 2048;

async function listen(app: INestApplication, adapter: string): Promise<number> {
  if (adapter === 'fastify') {
    await (app as NestFastifyApplication).listen({ port: 0, host: '127.0.0.1', backlog: LISTEN_BACKLOG });
  } else {
    // Nest hands extra arguments to http.Server#listen(port, host, backlog).
    await (app as unknown as { listen(port: number, host: string, backlog: number): Promise<unknown> }).listen(
      0,
      '127.0.0.1',
      LISTEN_BACKLOG,
    );
  }
  return (app.getHttpServer().address() as AddressInfo).port;
}

async function main(): Promise<void> {
  const adapter = process.env.HTTP_ADAPTER ?? 'express';
  const counter = new RoundTripCounter();
  const module = createBenchModule(counter);
  let app: INestApplication;
  if (adapter === 'fastify') {
    app = await NestFactory.create<NestFastifyApplication>(module, new FastifyAdapter({ bodyLimit: BODY_LIMIT_BYTES }), {
      logger: ['error', 'warn'],
    });
  } else {
    const express = await NestFactory.create<NestExpressApplication>(module, new ExpressAdapter(), { logger: ['error', 'warn'] });
    // Registered before init, so it replaces Express's default 100 kB JSON parser.
    express.useBodyParser('json', { limit: BODY_LIMIT_BYTES });
    app = express;
  }
  const port = await listen(app, adapter);
  const pool = new PoolWatch(driverPool(app.get<DataSource>(getDataSourceToken())));
  const profiler = new InProcessProfiler();

  process.on('message', (message: RunnerRequest) => {
    const reply = (body: WithoutId<AppReply>) => process.send!({ id: message.id, ...body });
    switch (message.type) {
      case 'pool-watch-start':
        pool.start();
        return reply({ type: 'ok' });
      case 'pool-watch-stop':
        return reply({ type: 'pool-peak', peak: pool.stop() });
      case 'count-start':
        counter.start();
        return reply({ type: 'ok' });
      case 'count-stop':
        return reply({ type: 'queries', queries: counter.stop() });
      case 'pool-state':
        return reply({ type: 'pool-state', ...pool.now() });
      case 'cpu': {
        const { user, system } = process.cpuUsage();
        return reply({ type: 'cpu', micros: user + system, promises: promisesCreated?.() });
      }
      case 'profile-start':
        void profiler.start().then(() => reply({ type: 'ok' }));
        return;
      case 'profile-stop':
        void profiler.stop(message.path).then(() => reply({ type: 'ok' }));
        return;
      case 'close':
        void app.close().then(() => process.exit(0));
        return;
    }
  });
  // The runner going away (even by a crash) ends the app too, rather than leaving it running.
  process.on('disconnect', () => process.exit(0));
  process.send!({ type: 'ready', port, poolMax: pool.max } satisfies AppEvent);
}

/**
 * The V8 CPU profiler of this process, started and stopped by the runner, so a
 * profile covers one route's measured load and not the app's start-up.
 */
class InProcessProfiler {
  private session?: Session;

  async start(): Promise<void> {
    this.session = new Session();
    this.session.connect();
    await this.post('Profiler.enable');
    // 100 µs between samples: requests of 1-2 ms of CPU get a few samples each over a run of seconds.
    await this.post('Profiler.setSamplingInterval', { interval: 100 });
    await this.post('Profiler.start');
  }

  async stop(path: string): Promise<void> {
    const { profile } = (await this.post('Profiler.stop')) as { profile: unknown };
    await writeFile(path, JSON.stringify(profile));
    this.session?.disconnect();
    this.session = undefined;
  }

  private post(method: string, params?: object): Promise<unknown> {
    return new Promise((resolve, reject) =>
      this.session!.post(method, params, (error, result) => (error ? reject(error) : resolve(result))),
    );
  }
}

main().catch((error: unknown) => {
  process.send?.({
    type: 'failed',
    error: error instanceof Error ? (error.stack ?? error.message) : String(error),
  } satisfies AppEvent);
  process.exitCode = 1;
});
