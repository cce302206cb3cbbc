import { createHash } from 'node:crypto';
import type { DataSource, EntityManager } from 'typeorm';
import {
  IdempotencyStore,
  type ClaimRef,
  type ClaimRequest,
  type ClaimResult,
  type PhaseState,
  type StoredResponse,
  type SweepOptions,
  type SweepResult,
} from '../core/idempotency-store.js';
import { keyStoreStatements } from './key-store.sql.js';
import { installRedactingLogger, redactQueryError } from './redacting-logger.js';
import { quoteTableName } from './identifiers.js';

interface ClaimRow {
  state: 'claimed' | 'in_flight' | 'completed' | 'mismatch' | 'retry';
  attempt: number;
  generation: string | null;
  retry_after: number | null;
  response_status: number | null;
  response_headers: Array<[string, string]> | null;
  response_body: Buffer | null;
  recovery_point: string | null;
  phase_results: string | null;
}

/** SQLSTATE of a lock wait that ran past `lock_timeout`. */
const LOCK_NOT_AVAILABLE = '55P03';

/** The part of TypeORM's postgres driver the store uses: a connection of its pool. */
interface PgDriver {
  obtainMasterConnection(): Promise<[unknown, (error?: unknown) => void]>;
}

/** SQLSTATE classes and codes that mean "the database is not there", not "the query is wrong". */
const UNAVAILABLE_SQLSTATES = new Set([
  '57P01',
  '57P02',
  '57P03',
  '53300',
  '53100',
  '08000',
  '08001',
  '08003',
  '08004',
  '08006',
  '08007',
]);
const UNAVAILABLE_ERRNOS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EHOSTUNREACH',
  'EAI_AGAIN',
  'ENETUNREACH',
]);
const UNAVAILABLE_MESSAGES = [
  'Connection terminated',
  'timeout exceeded when trying to connect',
  'Client has encountered a connection error',
  'Cannot use a pool after calling end',
  'Connection is not established',
  'the database system is',
];

/** node-postgres's client, as far as the store uses it. */
interface PgClient {
  query(config: { text: string; values: unknown[]; name?: string }): Promise<{ rows: unknown[]; rowCount: number | null }>;
}

/** Options of `PostgresIdempotencyStore`. */
export interface PostgresIdempotencyStoreOptions {
  /**
   * Run the claim and the completion as named prepared statements. Their
   * plans are cached per connection by the functions they call anyway; this
   * also saves the parse of the short call. Only on direct connections, or
   * PgBouncer 1.21+ with `max_prepared_statements`. Default false.
   */
  preparedStatements?: boolean;
  /**
   * Where claims, replays, 409/422 answers, releases and lease renewals run:
   * a data source with a small pool of its own, so they never queue behind
   * business transactions holding the main pool. Default: the main data source.
   */
  claimDataSource?: DataSource;
}

/**
 * The key store on PostgreSQL through a TypeORM `DataSource`. Every statement
 * is plain SQL with positional parameters, so it works unchanged through
 * PgBouncer in transaction pooling (no named prepared statements unless asked
 * for, no session state). All time comparisons use the database clock.
 */
export class PostgresIdempotencyStore extends IdempotencyStore<EntityManager> {
  private readonly table: string;
  /** The key table, possibly schema-qualified, as given (unquoted). */
  readonly tableName: string;
  private readonly sql: ReturnType<typeof keyStoreStatements>;
  private readonly sweepLockKey: string;

  private readonly claims: DataSource;

  constructor(
    private readonly dataSource: DataSource,
    tableName: string,
    private readonly options: PostgresIdempotencyStoreOptions = {},
  ) {
    super();
    this.claims = options.claimDataSource ?? dataSource;
    this.tableName = tableName;
    this.table = quoteTableName(tableName);
    this.sweepLockKey = `nest-idempotency:sweep:${tableName}`;
    this.sql = keyStoreStatements(this.table);
  }

  /**
   * @param tx claim inside this transaction (request-transaction mode) instead
   *   of committing on its own; a concurrent claim of the same key then waits
   *   on the row lock at most `lockTimeoutMs`, and a timeout reads as in flight.
   */
  async claim(request: ClaimRequest, tx?: EntityManager, lockTimeoutMs?: number): Promise<ClaimResult> {
    const params = [
      request.tenant,
      request.key,
      request.fingerprint,
      request.ownerToken,
      request.leaseMs,
      request.ttlMs,
      tx ? (lockTimeoutMs ?? 0) : null,
    ];
    let row: ClaimRow | undefined;
    try {
      row = (await this.run('claim', this.sql.claim, params, tx)).rows[0] as ClaimRow | undefined;
    } catch (error) {
      if (tx && (error as { code?: unknown }).code === LOCK_NOT_AVAILABLE) {
        return { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) };
      }
      throw error;
    }
    if (row) {
      switch (row.state) {
        case 'claimed':
          return {
            state: 'claimed',
            attempt: row.attempt,
            generation: row.generation ?? request.ownerToken,
            phases: { recoveryPoint: row.recovery_point, results: row.phase_results ? JSON.parse(row.phase_results) : {} },
          };
        case 'in_flight':
          return { state: 'in-flight', retryAfterSeconds: row.retry_after ?? 1 };
        case 'mismatch':
          return { state: 'mismatch' };
        case 'completed':
          return {
            state: 'completed',
            response: {
              status: row.response_status ?? 200,
              headers: row.response_headers ?? [],
              body: row.response_body,
            },
          };
      }
    }
    return { state: 'in-flight', retryAfterSeconds: 1 };
  }

  override async renewLease(ref: ClaimRef, leaseMs: number): Promise<boolean> {
    return (await this.run(undefined, this.sql.renewLease, [ref.tenant, ref.key, ref.ownerToken, leaseMs])).affected === 1;
  }

  /**
   * Like `DataSource.transaction`, except for what a failed ROLLBACK means.
   * TypeORM swallows it; here, when the work failed and the ROLLBACK cannot
   * reach the server, it is the ROLLBACK's error that is thrown: the
   * transaction's own connection died, which is the store's failure (a 503,
   * outcome unknown), not the work's, whatever the work then threw.
   */
  async transaction<T>(work: (tx: EntityManager) => Promise<T>): Promise<T> {
    const runner = this.dataSource.createQueryRunner();
    try {
      await runner.startTransaction();
      const result = await work(runner.manager);
      await runner.commitTransaction();
      return result;
    } catch (error) {
      if (runner.isTransactionActive || runner.isReleased) {
        try {
          await runner.rollbackTransaction();
        } catch (rollbackError) {
          if (this.isUnavailableError(rollbackError)) throw rollbackError;
        }
      }
      throw error;
    } finally {
      if (!runner.isReleased) await runner.release();
    }
  }

  async complete(ref: ClaimRef, response: StoredResponse, ttlMs: number, tx?: EntityManager): Promise<boolean> {
    const params = [ref.tenant, ref.key, ref.ownerToken, response.status, JSON.stringify(response.headers), response.body, ttlMs];
    const [row] = (await this.run('complete', this.sql.complete, params, tx, tx ? this.dataSource : this.claims)).rows as Array<{
      completed: boolean;
    }>;
    return row?.completed === true;
  }

  async recordPhase(ref: ClaimRef, phases: PhaseState, leaseMs: number, tx?: EntityManager): Promise<boolean> {
    const params = [ref.tenant, ref.key, ref.ownerToken, phases.recoveryPoint, JSON.stringify(phases.results), leaseMs];
    return (await this.run(undefined, this.sql.recordPhase, params, tx, tx ? this.dataSource : this.claims)).affected === 1;
  }

  async release(ref: ClaimRef): Promise<boolean> {
    return (await this.run(undefined, this.sql.release, [ref.tenant, ref.key, ref.ownerToken])).affected === 1;
  }

  /**
   * One lock-holding transaction on its own connection guards the whole run,
   * while each batch commits on its own, so deleted rows are released at once
   * and claims never wait behind a long sweep. `pg_try_advisory_xact_lock`
   * keeps this correct behind PgBouncer in transaction pooling, and a crashed
   * sweeper's lock goes with its connection.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    const started = Date.now();
    const lockRunner = this.dataSource.createQueryRunner();
    let batches = 0;
    let deleted = 0;
    try {
      await lockRunner.startTransaction();
      const [{ locked }] = (await lockRunner.query('SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)) AS locked', [
        this.sweepLockKey,
      ])) as Array<{ locked: boolean }>;
      if (!locked) return { ran: false, deleted: 0, batches: 0, durationMs: Date.now() - started, restedMs: 0 };
      const duty = options.dutyCycle ?? 1;
      let rested = 0;
      // At least one batch per run, so a tight budget still makes progress.
      for (;;) {
        const batchStarted = Date.now();
        const count = (await this.run(undefined, this.sql.sweepBatch, [options.batchSize], undefined, this.dataSource)).affected;
        batches++;
        deleted += count;
        if (count < options.batchSize) break;
        const rest = duty < 1 ? ((Date.now() - batchStarted) * (1 - duty)) / duty : 0;
        if (Date.now() + rest - started >= options.maxDurationMs) break;
        if (rest > 0) {
          await new Promise((resolve) => setTimeout(resolve, rest));
          rested += rest;
        }
      }
      return { ran: true, deleted, batches, durationMs: Date.now() - started, restedMs: Math.round(rested) };
    } finally {
      if (lockRunner.isTransactionActive) await lockRunner.rollbackTransaction().catch(() => undefined);
      await lockRunner.release();
    }
  }

  override async countExpired(limit: number): Promise<number> {
    const [row] = (await this.run(undefined, this.sql.countExpired, [limit], undefined, this.dataSource)).rows as Array<{
      expired: number;
    }>;
    return row?.expired ?? 0;
  }

  isUnavailableError(error: unknown): boolean {
    for (let current: unknown = error, depth = 0; current && depth < 5; depth++) {
      if (typeof current !== 'object') return false;
      const { code, message, name } = current as { code?: unknown; message?: unknown; name?: unknown };
      // TypeORM releases a transaction's runner when its connection dies; later statements then fail with this.
      if (name === 'QueryRunnerAlreadyReleasedError') return true;
      if (typeof code === 'string' && (UNAVAILABLE_SQLSTATES.has(code) || UNAVAILABLE_ERRNOS.has(code))) return true;
      if (typeof message === 'string' && UNAVAILABLE_MESSAGES.some((m) => message.includes(m))) return true;
      const next = current as { driverError?: unknown; cause?: unknown };
      current = next.driverError ?? next.cause;
    }
    return false;
  }

  /**
   * Runs one of the module's statements on the pg client underneath: in
   * `tx`'s transaction when given, else on a connection of `source` taken for
   * this one statement (by default the claim pool). TypeORM's query path is
   * skipped, since for these short statements it costs more app CPU than the
   * statement does; each is still logged through the data source's logger,
   * and its parameters (keys, tenants, bodies) reach neither a log nor the
   * error it throws (see redacting-logger.ts).
   */
  private async run(
    name: 'claim' | 'complete' | undefined,
    sql: string,
    params: unknown[],
    tx?: EntityManager,
    source: DataSource = this.claims,
  ): Promise<{ rows: unknown[]; affected: number }> {
    installRedactingLogger(source);
    const runner = tx?.queryRunner;
    let client: PgClient;
    let release: ((error?: unknown) => void) | undefined;
    if (runner) {
      client = (await runner.connect()) as PgClient;
    } else {
      [client, release] = (await (source.driver as unknown as PgDriver).obtainMasterConnection()) as [
        PgClient,
        (error?: unknown) => void,
      ];
    }
    let failure: unknown;
    try {
      source.logger.logQuery(sql, params, runner);
      const named = name && this.options.preparedStatements ? { name: this.statementName(name) } : {};
      const result = await client.query({ text: sql, values: params, ...named });
      return { rows: result.rows, affected: result.rowCount ?? 0 };
    } catch (error) {
      failure = error;
      source.logger.logQueryError(error as Error, sql, params, runner);
      throw redactQueryError(error, params);
    } finally {
      // A connection that failed is dropped from the pool rather than handed to the next caller.
      release?.(failure !== undefined && this.isUnavailableError(failure) ? failure : undefined);
    }
  }

  /** One name per statement text, so stores of different tables never collide on a connection. */
  private statementName(name: 'claim' | 'complete'): string {
    return `nest_idem_${name}_${createHash('sha1').update(this.table).digest('hex').slice(0, 12)}`;
  }
}
