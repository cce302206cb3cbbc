import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import {
  IdempotencyStore,
  type Begun,
  type ClaimMode,
  type ClaimRef,
  type ClaimRequest,
  type ClaimResult,
  type PhaseState,
  type StoredResponse,
  type SweepOptions,
  type SweepResult,
  type OpenAttempt,
} from '../core/idempotency-store.js';
import { FENCE_LOST_SQLSTATE, keyStoreFunction, keyStoreStatements } from './key-store.sql.js';
import { installRedactingLogger, redactQueryError, sqlMarker } from './redacting-logger.js';
import { quoteTableName } from './identifiers.js';
import { deleteInPacedBatches } from './paced-batches.js';
import { PartitionRetention, type PartitionStatus } from './partitioned/partition-retention.js';

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

/** An integer or decimal as a SQL literal; undefined for anything else (never a string built from input). */
function numberLiteral(value: number | null): string | undefined {
  if (value === null) return 'NULL';
  return Number.isFinite(value) ? String(value) : undefined;
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
  /** A query with no values goes as one simple-protocol message, which may hold several statements: one result each. */
  query(text: string): Promise<Array<{ rows: unknown[]; rowCount: number | null }>>;
  escapeLiteral(value: string): string;
}

/** The pg Pool under TypeORM's postgres driver, as far as the store looks at it. */
interface PgPool {
  idleCount: number;
  totalCount: number;
  waitingCount: number;
  options: { max: number };
}

/** Bodies up to this size are sent inline (hex) with the COMMIT; larger ones as a binary parameter, one more round trip. */
const INLINE_BODY_LIMIT = 64 * 1024;

/** Names the sweep's advisory lock, with the key table's oid after it. */
const SWEEP_LOCK_PREFIX = 'nest-idempotency:sweep:';

/** Past this share of claims answered without claiming, the claim pool is asked first (see `answeredShare`). */
const MOSTLY_ANSWERED = 0.5;

/** Longest expected wait for a business connection at which the claim still goes on it (see `mainPoolHasRoom`). */
const FUSED_CLAIM_MAX_WAIT_MS = 10;

/** The savepoint after a request-transaction claim: undoing the work back to it keeps the claim and its lock. */
const WORK_SAVEPOINT = 'nest_idempotency_work';

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
  /**
   * The key table is the partitioned one (`createPartitionedIdempotencyKeysMigration`):
   * `sweep` then keeps partitions made ahead and retires whole partitions
   * instead of deleting rows. The claim and completion calls are the same
   * (the table's functions differ). Default false.
   */
  partitioned?: boolean;
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

  private readonly claims: DataSource;
  /** Retention by partitions, for the partitioned table; undefined for the plain one. */
  private readonly partitions?: PartitionRetention;

  constructor(
    private readonly dataSource: DataSource,
    tableName: string,
    private readonly options: PostgresIdempotencyStoreOptions = {},
  ) {
    super();
    this.claims = options.claimDataSource ?? dataSource;
    this.tableName = tableName;
    this.table = quoteTableName(tableName);
    this.sql = keyStoreStatements(this.table);
    if (options.partitioned) this.partitions = new PartitionRetention(dataSource, this.table);
  }

  /** Whether the key table is the partitioned one. */
  get partitioned(): boolean {
    return this.partitions !== undefined;
  }

  /** The partitioned table's partitions, for health checks; undefined for the plain table. */
  async partitionStatus(defaultRowsLimit: number): Promise<PartitionStatus | undefined> {
    return this.partitions?.status(defaultRowsLimit);
  }

  /**
   * @param tx claim inside this transaction (request-transaction mode) instead
   *   of committing on its own; a concurrent claim of the same key then waits
   *   on the row lock at most `lockTimeoutMs`, and a timeout reads as in flight.
   */
  async claim(request: ClaimRequest, tx?: EntityManager, lockTimeoutMs?: number): Promise<ClaimResult> {
    let rows: ClaimRow[];
    try {
      rows =
        tx || this.options.preparedStatements
          ? await this.claimRows(request, tx ? (lockTimeoutMs ?? 0) : null, tx)
          : await this.claimAlone(request);
    } catch (error) {
      if (tx && (error as { code?: unknown }).code === LOCK_NOT_AVAILABLE) {
        return { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) };
      }
      throw error;
    }
    return this.claimResult(rows[0], request);
  }

  /**
   * A claim committed on its own, on the claim pool: one message whose
   * transaction does not wait for its WAL flush (see `begin`).
   */
  private async claimAlone(request: ClaimRequest): Promise<ClaimRow[]> {
    const [client, release] = (await (this.claims.driver as unknown as PgDriver).obtainMasterConnection()) as [
      PgClient,
      (error?: unknown) => void,
    ];
    let failure: unknown;
    try {
      const claim = this.claimCall(client, request, null);
      if (!claim) return await this.claimRows(request, null);
      const message = (call: string) => `${sqlMarker('claim')} BEGIN; SET LOCAL synchronous_commit TO off; ${call}; COMMIT`;
      const results = await this.runMessage(
        client,
        message(claim.text),
        message(claim.template),
        claim.params,
        undefined,
        this.claims,
      );
      return results[2].rows as ClaimRow[];
    } catch (error) {
      failure = error;
      // The message stopped inside its transaction: end it before the connection serves anyone else.
      if (!this.isUnavailableError(error)) await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      release(failure !== undefined && this.isUnavailableError(failure) ? failure : undefined);
    }
  }

  /** The claim function's rows, with its values as parameters (in `tx` when given, else on the claim pool). */
  private async claimRows(
    request: ClaimRequest,
    lockTimeoutMs: number | null,
    tx?: EntityManager,
    name: 'claim' | 'claim_in_transaction' = 'claim',
  ): Promise<ClaimRow[]> {
    const params = [
      request.tenant,
      request.key,
      request.fingerprint,
      request.ownerToken,
      request.leaseMs,
      request.ttlMs,
      lockTimeoutMs,
    ];
    if (name === 'claim_in_transaction')
      return (await this.run(undefined, this.sql.claimInTransaction, params, tx)).rows as ClaimRow[];
    return (await this.run('claim', this.sql.claim, params, tx)).rows as ClaimRow[];
  }

  /** What the claim function's row says, as the engine reads it. */
  private claimResult(row: ClaimRow | undefined, request: ClaimRequest): ClaimResult {
    switch (row?.state) {
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
          response: { status: row.response_status ?? 200, headers: row.response_headers ?? [], body: row.response_body },
        };
      default:
        return { state: 'in-flight', retryAfterSeconds: 1 };
    }
  }

  /**
   * The claim function's call with its values as literals, for a message of
   * several statements (`text`), and as logged (`template`, with the values
   * as parameters, which the redacting logger hides). Undefined when a value
   * cannot be a literal (a NUL ends a simple-protocol message).
   */
  private claimCall(
    client: PgClient,
    request: ClaimRequest,
    lockTimeoutMs: number | null,
    name: 'claim' | 'claim_in_transaction' = 'claim',
  ) {
    const values = [request.tenant, request.key, request.fingerprint, request.ownerToken];
    if (values.some((v) => v.includes('\0'))) return undefined;
    const [tenant, key, fingerprint, owner] = values.map((v) => client.escapeLiteral(v));
    const numbers = [request.leaseMs, request.ttlMs, lockTimeoutMs].map(numberLiteral);
    if (numbers.some((n) => n === undefined)) return undefined;
    const call = keyStoreFunction(this.table, name);
    return {
      text: `SELECT * FROM ${call}(${tenant}, ${key}, ${fingerprint}, ${owner}::uuid, ${numbers.join(', ')})`,
      template: `SELECT * FROM ${call}($1, $2, $3, $4::uuid, $5, $6, $7)`,
      params: [...values, request.leaseMs, request.ttlMs, lockTimeoutMs],
    };
  }

  /**
   * The completion's call with literals (see `claimCall`), and with its
   * values as parameters (`params`, for `sql`); `text` is undefined for a
   * value a literal cannot carry or a body too large to inline. Both raise
   * when the fence fails. A request-transaction claim is completed by
   * `complete_in_transaction`, which also writes the row a claim under the
   * key's lock did not.
   */
  private completionCall(client: PgClient, request: ClaimRequest, response: StoredResponse, ttlMs: number, writesRow: boolean) {
    const headersJson = JSON.stringify(response.headers);
    const strings = writesRow
      ? [request.tenant, request.key, request.fingerprint, request.ownerToken]
      : [request.tenant, request.key, request.ownerToken];
    const name = writesRow ? 'complete_in_transaction' : 'complete_or_raise';
    const call = keyStoreFunction(this.table, name);
    const placeholders = writesRow ? '$1, $2, $3, $4::uuid, $5, $6::jsonb, $7, $8' : '$1, $2, $3::uuid, $4, $5::jsonb, $6, $7';
    const params = [...strings, response.status, headersJson, response.body, ttlMs];
    const sql = `${sqlMarker('complete')} SELECT ${call}(${placeholders}) AS completed`;
    const template = `SELECT ${call}(${placeholders})`;
    const status = numberLiteral(response.status);
    const ttl = numberLiteral(ttlMs);
    const inlinable =
      ![...strings, headersJson].some((v) => v.includes('\0')) &&
      (response.body?.length ?? 0) <= INLINE_BODY_LIMIT &&
      status !== undefined &&
      ttl !== undefined;
    if (!inlinable) return { text: undefined, template, params, sql };
    const literals = strings.map((v) => client.escapeLiteral(v));
    const owner = `${literals.pop()}::uuid`;
    // Hex escape form: the same bytes whatever standard_conforming_strings says.
    const body = response.body ? `E'\\\\x${response.body.toString('hex')}'::bytea` : 'NULL::bytea';
    const values = [...literals, owner, status, `${client.escapeLiteral(headersJson)}::jsonb`, body, ttl];
    return { text: `SELECT ${call}(${values.join(', ')})`, template, params, sql };
  }

  /**
   * Sends `text` (several statements, values as literals) as one message and
   * returns a result per statement. It is logged as `template` with `params`,
   * so the redacting logger keeps keys, tenants and bodies out of the logs,
   * and an error it throws carries neither the text nor the values.
   */
  private async runMessage(
    client: PgClient,
    text: string,
    /** What is logged: `text` with `params` in place of its literals. */
    template: string,
    params: unknown[],
    runner?: QueryRunner,
    source: DataSource = this.dataSource,
  ): Promise<Array<{ rows: unknown[]; rowCount: number | null }>> {
    installRedactingLogger(source);
    const logged = template;
    source.logger.logQuery(logged, params, runner);
    try {
      const result = await client.query(text);
      return Array.isArray(result) ? result : [result];
    } catch (error) {
      source.logger.logQueryError(error as Error, logged, params, runner);
      throw redactQueryError(error, params);
    }
  }

  /**
   * The claim and the BEGIN of the work's transaction in one round trip, on
   * the connection the work then uses: one simple-protocol message, whose
   * values are literals escaped by the driver.
   *
   * - `separate`: `BEGIN; SET LOCAL synchronous_commit TO off; SELECT claim;
   *   COMMIT; START TRANSACTION`. The claim commits on its own (another
   *   connection sees it at once; a later ROLLBACK leaves it) without waiting
   *   for its WAL flush: the work's COMMIT that follows flushes it, and a
   *   claim lost in a crash before that is a key that was never claimed. When
   *   the main pool has no connection free, the claim goes to the claim pool
   *   instead, so that replays and 409s never queue behind business
   *   transactions, and the BEGIN follows once a connection is free.
   * - `request-transaction`: `START TRANSACTION; SELECT claim; SAVEPOINT`.
   *   The savepoint lets a failure's response be stored under the claim's
   *   lock, so a duplicate waiting on it finds the stored answer.
   *
   * Behind PgBouncer in transaction pooling the message ends inside an open
   * transaction, so the server connection stays with this client.
   */
  override async begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs = 0): Promise<Begun<EntityManager>> {
    if (this.options.preparedStatements) return super.begin(request, mode, lockTimeoutMs);
    if (mode === 'separate' && (this.answeredShare > MOSTLY_ANSWERED || !this.mainPoolHasRoom())) {
      const claim = await this.claim(request);
      this.noteClaim(claim);
      if (claim.state !== 'claimed') return { claim };
      const runner = this.dataSource.createQueryRunner();
      try {
        await runner.startTransaction();
      } catch (error) {
        await this.abandon(runner, error);
        // BEGIN failed, so the work never ran: give the claim back, so a retry need not wait out the lease.
        await this.release(request).catch(() => false);
        throw error;
      }
      return { claim, attempt: this.openAttempt(runner, request, false) };
    }
    const runner = this.dataSource.createQueryRunner();
    const lockTimeout = mode === 'request-transaction' ? lockTimeoutMs : null;
    // Under READ COMMITTED (PostgreSQL's default) a request-transaction claim writes nothing for a new key: each
    // statement reads what committed before it, so the row read after the key's lock was granted is the latest.
    // A transaction snapshot taken before that wait (REPEATABLE READ, SERIALIZABLE) would miss it: there the
    // claim writes the in-flight row, whose unique index serialises duplicates instead.
    const level = this.dataSource.options.isolationLevel;
    const claimFunction =
      mode === 'request-transaction' && (!level || level === 'READ COMMITTED') && !this.partitions
        ? 'claim_in_transaction'
        : 'claim';
    let rows: ClaimRow[] | undefined;
    let refused: unknown;
    try {
      await this.fusing(runner, 'START TRANSACTION', async (client, startTransaction) => {
        const claim = this.claimCall(client, request, lockTimeout, claimFunction);
        if (claim === undefined) {
          // A value a literal cannot carry (a NUL): the same statements, each on its own.
          if (mode === 'separate') {
            rows = await this.claimRows(request, null);
            await client.query(startTransaction);
          } else {
            await client.query(startTransaction);
            rows = await this.claimRows(request, lockTimeout, runner.manager, claimFunction).catch((error: unknown) => {
              refused = error;
              return undefined;
            });
            if (rows) await client.query(`SAVEPOINT ${WORK_SAVEPOINT}`);
          }
          return;
        }
        const message = (call: string) =>
          mode === 'separate'
            ? `${sqlMarker('claim-then-begin')} BEGIN; SET LOCAL synchronous_commit TO off; ${call}; COMMIT; ${startTransaction}`
            : `${sqlMarker('begin-and-claim')} ${startTransaction}; ${call}; SAVEPOINT ${WORK_SAVEPOINT}`;
        const results = await this.runMessage(client, message(claim.text), message(claim.template), claim.params, runner).catch(
          (error: unknown) => {
            // The database answered with an error: the message stopped there; the open transaction is rolled back below.
            if (this.isUnavailableError(error)) throw error;
            refused = error;
            return undefined;
          },
        );
        if (results) rows = results[mode === 'separate' ? 2 : 1].rows as ClaimRow[];
      });
    } catch (error) {
      await this.abandon(runner, error);
      // The claim may have committed before the connection was lost: give it back if the store still answers.
      if (mode === 'separate') await this.release(request).catch(() => false);
      throw error;
    }
    if (refused !== undefined || !rows) {
      await this.abandon(runner);
      if (
        refused !== undefined &&
        mode === 'request-transaction' &&
        (refused as { code?: unknown }).code === LOCK_NOT_AVAILABLE
      ) {
        return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
      }
      throw refused ?? new Error('The claim returned no row.');
    }
    const claim = this.claimResult(rows[0], request);
    if (mode === 'separate') this.noteClaim(claim);
    if (claim.state !== 'claimed') {
      // Nothing to do in the transaction just opened: the answer need not wait for its ROLLBACK.
      void this.abandon(runner);
      return { claim };
    }
    return {
      claim,
      attempt: this.openAttempt(runner, request, mode === 'request-transaction', claimFunction === 'claim_in_transaction'),
    };
  }

  /**
   * The end of an attempt begun on `runner`: the completion and the COMMIT in one round trip.
   *
   * @param inTransaction a request-transaction claim: its work runs after a savepoint
   * @param writesRow the claim wrote no row (`claim_in_transaction`): the completion writes it
   */
  private openAttempt(
    runner: QueryRunner,
    request: ClaimRequest,
    inTransaction: boolean,
    writesRow = false,
  ): OpenAttempt<EntityManager> {
    let ended = false;
    let openedAt = performance.now();
    // A distinct value per open attempt: it is the attempt's entry in openAttempts.
    while (this.openAttempts.has(openedAt)) openedAt += 1e-6;
    this.openAttempts.add(openedAt);
    const end = async (failure?: unknown) => {
      ended = true;
      this.recordHold(openedAt);
      await this.abandon(runner, failure);
    };
    return {
      tx: runner.manager,
      commit: async (response, ttlMs) => {
        if (ended) throw new Error('This attempt has already ended.');
        try {
          await this.fusing(runner, 'COMMIT', async (client) => {
            const completion = this.completionCall(client, request, response, ttlMs, writesRow);
            if (completion.text) {
              const message = (call: string) => `${sqlMarker('complete-and-commit')} ${call}; COMMIT`;
              await this.runMessage(client, message(completion.text), message(completion.template), completion.params, runner);
            } else {
              await this.run(undefined, completion.sql, completion.params, runner.manager, this.dataSource);
              await client.query('COMMIT');
            }
          });
          ended = true;
          this.recordHold(openedAt);
          await runner.release();
          return true;
        } catch (error) {
          // The message stopped before its COMMIT; TypeORM's commitTransaction threw, so its subscribers were told of no
          // commit, and the rollback below tells them of the rollback.
          await end(error);
          if ((error as { code?: unknown }).code === FENCE_LOST_SQLSTATE) return false;
          throw error;
        }
      },
      rollback: async (keepClaim) => {
        if (ended) return false;
        if (keepClaim && inTransaction) {
          try {
            const client = (await runner.connect()) as PgClient;
            const undo = `${sqlMarker('undo-work')} ROLLBACK TO SAVEPOINT ${WORK_SAVEPOINT}`;
            await this.runMessage(client, undo, undo, [], runner);
            return true;
          } catch (error) {
            if (this.isUnavailableError(error)) {
              await end(error);
              throw error;
            }
          }
        }
        ended = true;
        this.recordHold(openedAt);
        try {
          if (runner.isTransactionActive) await runner.rollbackTransaction();
        } catch (error) {
          if (this.isUnavailableError(error)) throw error;
        } finally {
          if (!runner.isReleased) await runner.release();
        }
        return false;
      },
    };
  }

  /**
   * Runs TypeORM's `runner.startTransaction()` or `commitTransaction()` with
   * its one statement (`START TRANSACTION`, `COMMIT`) replaced by `send`, so
   * the app's transaction subscribers and TypeORM's own bookkeeping see the
   * transaction as usual, while the statement travels in one message with
   * the module's.
   */
  private async fusing(
    runner: QueryRunner,
    statement: 'START TRANSACTION' | 'COMMIT',
    send: (client: PgClient, statement: string) => Promise<void>,
  ) {
    // TypeORM follows START TRANSACTION with the data source's isolation level, which must come before any other
    // statement of the transaction: it goes into the message instead (TypeORM has validated it as one of the levels).
    const level = statement === 'START TRANSACTION' ? runner.connection.options.isolationLevel : undefined;
    const sent = level && /^[A-Z ]+$/.test(level) ? `START TRANSACTION ISOLATION LEVEL ${level}` : statement;
    const own = runner as QueryRunner & { query: QueryRunner['query'] };
    const original = Object.getPrototypeOf(runner).query as QueryRunner['query'];
    // The prototype's query is assigned back, never the override deleted: a delete would turn the runner into a
    // dictionary-mode object, and every property read of TypeORM on it (the handler's statements) slower.
    const restore = () => (own.query = original);
    own.query = async function (this: QueryRunner, sql: string, ...rest: unknown[]) {
      if (sql === statement) {
        await send((await runner.connect()) as PgClient, sent);
        if (sent === statement) restore();
        return [];
      }
      if (sent !== statement && sql.startsWith('SET TRANSACTION ISOLATION LEVEL')) {
        restore();
        return [];
      }
      return (original as (...args: unknown[]) => Promise<unknown>).call(this, sql, ...rest);
    } as QueryRunner['query'];
    try {
      if (statement === 'START TRANSACTION') await runner.startTransaction();
      else await runner.commitTransaction();
    } finally {
      restore();
    }
  }

  /**
   * Rolls back whatever `runner` has open, and gives its connection back;
   * never throws. After `failure` that says the connection is gone, nothing
   * is sent on it (a dead pg client can queue a ROLLBACK for ever) and the
   * pool is told to drop it rather than hand it to the next caller.
   */
  private async abandon(runner: QueryRunner, failure?: unknown): Promise<void> {
    if (failure !== undefined && this.isUnavailableError(failure)) {
      if (runner.isReleased) return;
      // TypeORM's own path for a connection that errored: passes the error on to the pool, which destroys the client.
      const release = (runner as unknown as { releasePostgresConnection?: (error: unknown) => Promise<void> })
        .releasePostgresConnection;
      await (release ? release.call(runner, failure) : runner.release()).catch(() => undefined);
      return;
    }
    try {
      if (runner.isTransactionActive && !runner.isReleased) await runner.rollbackTransaction();
    } catch {
      // A connection that died takes its transaction with it.
    } finally {
      if (!runner.isReleased) await runner.release().catch(() => undefined);
    }
  }

  /**
   * Whether the claim can go on the business connection without keeping a
   * replay or a 409 waiting long: the main pool has a connection free, or
   * its queue moves fast. A caller would wait about (queue + 1) / pool size
   * of the time a business transaction holds its connection: under fast
   * handlers that is a few milliseconds, and the fused message saves a round
   * trip; under slow ones (every connection held for 200 ms) the claim pool
   * answers at once instead.
   */
  private mainPoolHasRoom(): boolean {
    if (this.claims === this.dataSource) return true;
    const pool = (this.dataSource.driver as unknown as { master?: PgPool }).master;
    if (!pool?.options) return true;
    if (pool.waitingCount === 0 && (pool.idleCount > 0 || pool.totalCount < pool.options.max)) return true;
    const expectedWaitMs = ((pool.waitingCount + 1) / pool.options.max) * this.holdMs;
    if (expectedWaitMs > FUSED_CLAIM_MAX_WAIT_MS) return false;
    // The average only learns of slow transactions once they end. The queue has stalled when even the attempt opened
    // last has been open for longer than the bound: none is then known to move. (Any one old attempt is not enough:
    // under steady load some always are while new ones open every few milliseconds, and every new key would pay the
    // claim pool's extra round trip.)
    const now = performance.now();
    let youngest = Number.POSITIVE_INFINITY;
    for (const openedAt of this.openAttempts) youngest = Math.min(youngest, now - openedAt);
    return youngest <= FUSED_CLAIM_MAX_WAIT_MS;
  }

  /**
   * The share of recent separate claims answered without a claim (replays,
   * 409s, 422s), a moving average. For those the claim's message opened a
   * business transaction for nothing, rolled back after the answer: while
   * they are most of the traffic (a retry storm, a replaying client), claims
   * go to the claim pool first, one round trip each and no transaction.
   */
  private answeredShare = 0;

  private noteClaim(claim: ClaimResult): void {
    this.answeredShare = this.answeredShare * 0.95 + (claim.state === 'claimed' ? 0 : 0.05);
  }

  /** When each attempt still open on the business pool began. */
  private readonly openAttempts = new Set<number>();

  /** How long the work's transactions hold their connection, a moving average (starts pessimistic: the claim pool). */
  private holdMs = Number.POSITIVE_INFINITY;

  private recordHold(startedAt: number): void {
    this.openAttempts.delete(startedAt);
    const held = performance.now() - startedAt;
    this.holdMs = Number.isFinite(this.holdMs) ? this.holdMs * 0.9 + held * 0.1 : held;
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
   * Ends the lease of the attempt holding `ownerToken` and fences it with a
   * new token (an operator's release, from the board): the next retry takes
   * the key over at once.
   * @returns the attempt's key, or undefined when it no longer holds one
   */
  async endLease(tenant: string, ownerToken: string): Promise<string | undefined> {
    const { rows } = await this.run(undefined, this.sql.endLease, [tenant, ownerToken]);
    return (rows as Array<{ key: string }>)[0]?.key;
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
    try {
      await lockRunner.startTransaction();
      const client = (await lockRunner.connect()) as PgClient;
      const [prefix, table] = [SWEEP_LOCK_PREFIX, this.table].map((value) => client.escapeLiteral(value));
      // The table as PostgreSQL resolves it (its oid): same-named tables in two schemas are two sweeps, not one lock.
      // Literals, not parameters: a parameterised statement leaves its unnamed portal, and the portal's snapshot,
      // open until the next statement, and this transaction then sits idle for the whole run holding back the
      // xmin horizon: no VACUUM anywhere in the database could remove what the sweep deletes, and each batch
      // would walk the index entries of every row deleted before it (a 5M-row sweep slowed to a crawl).
      const [{ locked }] = (await lockRunner.query(
        `SELECT pg_try_advisory_xact_lock(hashtextextended(${prefix} || coalesce(to_regclass(${table})::oid::text, ${table}), 0)) AS locked`,
      )) as Array<{ locked: boolean }>;
      if (!locked) return { ran: false, deleted: 0, batches: 0, durationMs: Date.now() - started, restedMs: 0 };
      if (this.partitions) return await this.partitions.run(options);
      // Where along the expires_at index the next batch starts (see sweepBatch).
      let after = '-infinity';
      const run = await deleteInPacedBatches(
        async () => {
          const params = [options.batchSize, after];
          const [batch] = (await this.run(undefined, this.sql.sweepBatch, params, undefined, this.dataSource)).rows as Array<{
            deleted: number;
            last: string | null;
          }>;
          if (batch.last !== null) after = batch.last;
          return batch.deleted;
        },
        options,
        started,
      );
      return { ran: true, ...run, durationMs: Date.now() - started };
    } finally {
      if (lockRunner.isTransactionActive) await lockRunner.rollbackTransaction().catch(() => undefined);
      await lockRunner.release();
    }
  }

  override async countExpired(limit: number): Promise<number> {
    if (this.partitions) return this.partitions.countExpired(limit);
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
