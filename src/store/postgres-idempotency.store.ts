import { createHash } from 'node:crypto';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import {
  IdempotencyStore,
  type ClaimRef,
  type ClaimRequest,
  type ClaimResult,
  type PhaseState,
  type StoredResponse,
  type SweepOptions,
  type SweepResult,
} from './idempotency-store.js';
import { keyStoreStatements } from './key-store.sql.js';
import { installRedactingLogger, redactQueryError } from './redacting-logger.js';
import { quoteTableName } from './sql.js';

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

/** How many times a claim re-reads a row that changed under its statement snapshot. */
const CLAIM_ATTEMPTS = 3;

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

/**
 * The key store on PostgreSQL through a TypeORM `DataSource`. Every statement
 * is plain SQL with positional parameters, so it works unchanged through
 * PgBouncer in transaction pooling (no named prepared statements, no session
 * state). All time comparisons use the database clock.
 */
export class PostgresIdempotencyStore extends IdempotencyStore<EntityManager> {
  private readonly table: string;
  private readonly sql: ReturnType<typeof keyStoreStatements>;
  private readonly sweepLockKey: string;

  /**
   * @param options.preparedStatements run the claim and the completion as
   *   named prepared statements, so PostgreSQL parses and plans them once per
   *   connection instead of on every request (the claim is a long statement:
   *   this roughly halves its server CPU). Only on direct connections, or
   *   PgBouncer 1.21+ with `max_prepared_statements`: transaction pooling in
   *   older PgBouncers breaks named statements. Default false.
   */
  constructor(
    private readonly dataSource: DataSource,
    tableName: string,
    private readonly options: { preparedStatements?: boolean } = {},
  ) {
    super();
    this.table = quoteTableName(tableName);
    this.sweepLockKey = `nest-idempotency:sweep:${tableName}`;
    this.sql = keyStoreStatements(this.table);
  }

  async claim(request: ClaimRequest): Promise<ClaimResult> {
    const params = [request.tenant, request.key, request.fingerprint, request.ownerToken, request.leaseMs, request.ttlMs];
    for (let attempt = 1; attempt <= CLAIM_ATTEMPTS; attempt++) {
      const rows = (await this.run('claim', this.sql.claim, params)).rows as ClaimRow[];
      const row = rows[0];
      if (!row || row.state === 'retry') continue;
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
    // The row kept changing under us: another attempt is working on this key.
    return { state: 'in-flight', retryAfterSeconds: 1 };
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
    return (await this.run('complete', this.sql.complete, params, tx?.queryRunner)).affected === 1;
  }

  async recordPhase(ref: ClaimRef, phases: PhaseState, leaseMs: number, tx?: EntityManager): Promise<boolean> {
    const params = [ref.tenant, ref.key, ref.ownerToken, phases.recoveryPoint, JSON.stringify(phases.results), leaseMs];
    return (await this.execute(this.sql.recordPhase, params, tx?.queryRunner)) === 1;
  }

  async release(ref: ClaimRef): Promise<boolean> {
    return (await this.execute(this.sql.release, [ref.tenant, ref.key, ref.ownerToken])) === 1;
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
        const count = await this.execute(this.sql.sweepBatch, [options.batchSize]);
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

  /** Runs a write and returns the number of rows it affected, in `runner`'s transaction if given. */
  private async execute(sql: string, params: unknown[], runner?: QueryRunner): Promise<number> {
    return (await this.run(undefined, sql, params, runner)).affected;
  }

  /**
   * Runs one statement on `runner` (its transaction) or a pooled connection of
   * its own. With `preparedStatements` and a `name`, as a named prepared
   * statement on the pg client itself, since TypeORM cannot name one; it is
   * still logged through the data source's logger like every other query.
   * Either way the parameters (keys, tenants, bodies) reach neither a log nor
   * the error it throws (see redacting-logger.ts).
   */
  private async run(
    name: 'claim' | 'complete' | undefined,
    sql: string,
    params: unknown[],
    runner?: QueryRunner,
  ): Promise<{ rows: unknown[]; affected: number }> {
    installRedactingLogger(this.dataSource);
    const own = runner ? undefined : this.dataSource.createQueryRunner();
    const active = (runner ?? own)!;
    try {
      if (name && this.options.preparedStatements) {
        const client = (await active.connect()) as {
          query(config: { name: string; text: string; values: unknown[] }): Promise<{ rows: unknown[]; rowCount: number | null }>;
        };
        this.dataSource.logger.logQuery(sql, params, active);
        try {
          const result = await client.query({ name: this.statementName(name), text: sql, values: params });
          return { rows: result.rows, affected: result.rowCount ?? 0 };
        } catch (error) {
          this.dataSource.logger.logQueryError(error as Error, sql, params, active);
          throw error;
        }
      }
      const result = (await active.query(sql, params, true)) as { records?: unknown[]; affected?: number };
      return { rows: result.records ?? [], affected: result.affected ?? 0 };
    } catch (error) {
      throw redactQueryError(error, params);
    } finally {
      await own?.release();
    }
  }

  /** One name per statement text, so stores of different tables never collide on a connection. */
  private statementName(name: 'claim' | 'complete'): string {
    return `nest_idem_${name}_${createHash('sha1').update(this.table).digest('hex').slice(0, 12)}`;
  }
}
