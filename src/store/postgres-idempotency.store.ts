import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import {
  IdempotencyStore,
  type BeginResult,
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
import { FENCE_LOST_SQLSTATE, keyStoreStatements } from './key-store.sql.js';
import { installRedactingLogger, redactQueryError } from './redacting-logger.js';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import { pipelined, type PipelineClient, type PipelinedResult, type PipelinedStatement } from './pipelined.js';
import { quoteTableName } from './identifiers.js';
import { deleteInPacedBatches } from './paced-batches.js';
import { PartitionRetention, type PartitionStatus } from './partitioned/partition-retention.js';

interface ClaimRow {
  state: 'claimed' | 'in_flight' | 'completed' | 'mismatch';
  attempt: number;
  generation: string | null;
  retry_after: number | null;
  response_status: number | null;
  response_headers: Array<[string, string]> | null;
  response_body: Buffer | null;
  recovery_point: string | null;
  phase_results: string | null;
}

/** SQLSTATE of a serialization failure (REPEATABLE READ, SERIALIZABLE): a row changed after the snapshot. */
const SERIALIZATION_FAILURE = '40001';

/** SQLSTATE of a server process ended by `pg_terminate_backend`. */
const ADMIN_SHUTDOWN = '57P01';

/**
 * Opens the claim's own transaction, and an autocommit write's: READ COMMITTED
 * whatever default the server, the database, the role or the connection sets.
 */
const BEGIN_READ_COMMITTED = 'BEGIN ISOLATION LEVEL READ COMMITTED';

/**
 * A request-transaction claim whose snapshot predates the key's last commit (REPEATABLE READ, SERIALIZABLE): its
 * write met the row the snapshot missed (a serialization failure), and the transaction starts again.
 */
const STALE_SNAPSHOT = Symbol('stale snapshot');

/** How often `begin` starts a request-transaction attempt again for a stale snapshot, at least, before answering 409. */
const STALE_SNAPSHOT_TRIES = 5;

function sqlState(error: unknown): unknown {
  return (error as { code?: unknown } | undefined)?.code;
}

/** Whether a fenced statement of the module failed because the key is no longer this attempt's. */
function isFenceLost(error: unknown): boolean {
  return sqlState(error) === FENCE_LOST_SQLSTATE;
}

/** Whether a `holdKeyLock` statement answered that the lock was taken. */
function lockTaken(result: PipelinedResult | undefined): boolean {
  return result?.ok === true && (result.rows[0] as { locked?: boolean } | undefined)?.locked === true;
}

/** The statement's answer; its error, thrown, when it failed. */
function answerOf(result: PipelinedResult): { rows: unknown[]; rowCount: number | null } {
  if (!result.ok) throw result.error;
  return result;
}

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
type PgClient = PipelineClient & {
  query(text: string): Promise<unknown>;
  escapeLiteral(value: string): string;
};

/** The pg Pool under TypeORM's postgres driver, as far as the store looks at it. */
interface PgPool {
  idleCount: number;
  totalCount: number;
  waitingCount: number;
  options: { max: number };
}

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
    this.sql = keyStoreStatements(this.table, tableName);
    if (options.partitioned) this.partitions = new PartitionRetention(dataSource, this.table);
    // Learnt now rather than on the first request's way (tried again there if this fails).
    if (dataSource.isInitialized) this.businessReadCommitted().catch(() => undefined);
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
   *   for the key's lock at most `lockTimeoutMs`, and a timeout reads as in
   *   flight. (Under REPEATABLE READ or SERIALIZABLE a claim whose snapshot
   *   predates the key's last commit throws a serialization failure here:
   *   `begin` starts such a transaction again instead.)
   */
  async claim(request: ClaimRequest, tx?: EntityManager, lockTimeoutMs?: number): Promise<ClaimResult> {
    if (!tx) return this.claimResult((await this.claimAlone(request))[0], request);
    const statement = this.claimStatement(request, this.inTransactionClaim, lockTimeoutMs ?? 0);
    const { rows } = await this.run(statement.text, statement.values!, { tx, name: statement.name });
    return this.claimResult(rows[0] as ClaimRow | undefined, request);
  }

  /** The claim function of claim mode `request-transaction`: the partitioned table's one claim takes both modes. */
  private get inTransactionClaim(): 'claim' | 'claim_in_transaction' {
    return this.partitions ? 'claim' : 'claim_in_transaction';
  }

  /**
   * A claim committed on its own, on the claim pool: its transaction, the
   * claim and its COMMIT in one round trip (see `begin`).
   */
  private async claimAlone(request: ClaimRequest): Promise<ClaimRow[]> {
    const [client, release] = await this.connection(this.claims);
    let failure: unknown;
    try {
      const [, claim, commit] = await this.exchange(
        client,
        [{ text: BEGIN_READ_COMMITTED }, this.claimStatement(request, 'claim', null), { text: 'COMMIT' }],
        this.claims,
      );
      const { rows } = answerOf(claim);
      answerOf(commit);
      return rows as ClaimRow[];
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      // A failed claim's COMMIT answered ROLLBACK: the connection is idle again, unless it died.
      release(failure !== undefined && this.isUnavailableError(failure) ? failure : undefined);
    }
  }

  /** The call of a claim function, its values as parameters. */
  private claimStatement(
    request: ClaimRequest,
    name: 'claim' | 'claim_in_transaction',
    lockTimeoutMs: number | null,
  ): PipelinedStatement {
    return {
      text: name === 'claim' ? this.sql.claim : this.sql.claimInTransaction,
      values: [
        request.tenant,
        request.key,
        request.fingerprint,
        request.ownerToken,
        request.leaseMs,
        request.ttlMs,
        lockTimeoutMs,
      ],
      ...(this.options.preparedStatements ? { name: this.statementName(name) } : {}),
    };
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

  /** The completion's call, its values as parameters; a request-transaction claim that wrote no row writes it here. */
  private completionStatement(
    request: ClaimRequest,
    response: StoredResponse,
    ttlMs: number,
    writesRow: boolean,
  ): PipelinedStatement {
    const headers = JSON.stringify(response.headers);
    return writesRow
      ? {
          text: this.sql.completeInTransaction,
          values: [
            request.tenant,
            request.key,
            request.fingerprint,
            request.ownerToken,
            response.status,
            headers,
            response.body,
            ttlMs,
          ],
        }
      : {
          text: this.sql.completeOrRaise,
          values: [request.tenant, request.key, request.ownerToken, response.status, headers, response.body, ttlMs],
          ...(this.options.preparedStatements ? { name: this.statementName('complete_or_raise') } : {}),
        };
  }

  /**
   * Sends `statements` in one round trip (see `pipelined`) and returns what
   * each answered. Each is logged through the data source's logger with its
   * parameters, which the redacting logger hides, and a failure carries
   * neither the text nor the values; a failure's error is logged once.
   */
  private async exchange(
    client: PgClient,
    statements: readonly PipelinedStatement[],
    source: DataSource,
    runner?: QueryRunner,
  ): Promise<PipelinedResult[]> {
    installRedactingLogger(source);
    for (const statement of statements) source.logger.logQuery(statement.text, statement.values, runner);
    const results = await pipelined(client, statements);
    return results.map((result, i) => {
      if (result.ok) return result;
      const { text, values = [] } = statements[i];
      source.logger.logQueryError(result.error as Error, text, values, runner);
      return { ok: false, error: redactQueryError(result.error, values) };
    });
  }

  /**
   * The claim and the BEGIN of the work's transaction in one round trip, on
   * the connection the work then uses: one pipeline of parameterised
   * statements (see `pipelined`), no value ever in a statement's text.
   *
   * - `separate`: `BEGIN ISOLATION LEVEL READ COMMITTED`, the claim, `COMMIT`,
   *   `START TRANSACTION`. The claim commits on its own (another connection
   *   sees it at once; a later ROLLBACK leaves it), durably: the work may use
   *   its generation in calls to other systems before its own COMMIT, and a
   *   retry after a crash of the database must find that same generation.
   *   It runs at READ COMMITTED whatever the server's, the database's or the
   *   role's default, so a concurrent claim's commit is read, never a
   *   serialization failure. When the main pool has no connection free, the
   *   claim goes to the claim pool instead, so that replays and 409s never
   *   queue behind business transactions, and the BEGIN follows once a
   *   connection is free.
   * - `request-transaction`: `START TRANSACTION`, the claim, `SAVEPOINT`. The
   *   savepoint lets a failure's response be stored under the key's lock, so a
   *   duplicate waiting on it finds the stored answer. The transaction keeps
   *   the app's isolation level; under a stricter one than READ COMMITTED a
   *   claim whose snapshot predates the key's last commit fails with a
   *   serialization failure, and the transaction starts again (the
   *   partitioned table refuses the mode there).
   *
   * Behind PgBouncer in transaction pooling the pipeline ends inside an open
   * transaction, so the server connection stays with this client.
   */
  override async begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs = 0): Promise<BeginResult<EntityManager>> {
    if (mode === 'request-transaction' && this.partitions && !(await this.businessReadCommitted())) {
      throw new IdempotencyConfigurationError(messages.config.partitionedRequestTransactionIsolation(this.tableName));
    }
    // A stale snapshot means the key's previous holder committed after the transaction began: start again, waiting for
    // the key no longer in all than the caller allows, and a few times at least.
    const deadline = Date.now() + lockTimeoutMs;
    for (let tries = 1; ; tries++) {
      const begun = await this.beginOnce(request, mode, Math.max(0, deadline - Date.now()));
      if (begun !== STALE_SNAPSHOT) return begun;
      if (tries >= STALE_SNAPSHOT_TRIES && Date.now() >= deadline) return { claim: { state: 'in-flight', retryAfterSeconds: 1 } };
    }
  }

  private async beginOnce(
    request: ClaimRequest,
    mode: ClaimMode,
    lockTimeoutMs: number,
  ): Promise<BeginResult<EntityManager> | typeof STALE_SNAPSHOT> {
    if (mode === 'separate' && (this.answeredShare > MOSTLY_ANSWERED || !this.mainPoolHasRoom())) {
      return this.beginAfterClaimPool(request);
    }
    const holdsKeyLock = mode === 'separate' && !(await this.businessReadCommitted());
    const runner = this.dataSource.createQueryRunner();
    const claimFunction = mode === 'separate' ? 'claim' : this.inTransactionClaim;
    const claimStatement = this.claimStatement(request, claimFunction, mode === 'separate' ? null : lockTimeoutMs);
    let results: PipelinedResult[] = [];
    try {
      await this.fusing(runner, 'START TRANSACTION', async (client, startTransaction) => {
        const statements =
          mode === 'separate'
            ? [{ text: BEGIN_READ_COMMITTED }, claimStatement, { text: 'COMMIT' }, { text: startTransaction }]
            : [{ text: startTransaction }, claimStatement, { text: `SAVEPOINT ${WORK_SAVEPOINT}` }];
        if (holdsKeyLock) statements.push(this.holdKeyLockStatement(request));
        results = await this.exchange(client, statements, this.dataSource, runner);
        // The connection is gone: whatever else answered, nothing can go on on it.
        const lost = results.find((result) => !result.ok && this.isUnavailableError(result.error));
        if (lost) throw (lost as { error: unknown }).error;
        // TypeORM must not count a transaction that did not open.
        const opened = results[mode === 'separate' ? 3 : 0];
        if (!opened.ok) throw opened.error;
      });
    } catch (error) {
      await this.abandon(runner, error);
      // The claim may have committed before the BEGIN failed or the connection was lost: give it back if the store
      // still answers, so a retry need not wait out the lease.
      if (mode === 'separate') await this.release(request).catch(() => false);
      throw error;
    }
    const [claimed, committed] = mode === 'separate' ? [results[1], results[2]] : [results[1], results[1]];
    if (!claimed.ok || !committed.ok) {
      await this.abandon(runner);
      const error = claimed.ok ? (committed as { error: unknown }).error : claimed.error;
      if (mode === 'request-transaction' && sqlState(error) === SERIALIZATION_FAILURE) return STALE_SNAPSHOT;
      throw error;
    }
    const row = claimed.rows[0] as ClaimRow | undefined;
    const claim = this.claimResult(row, request);
    if (mode === 'separate') this.noteClaim(claim);
    if (claim.state !== 'claimed') {
      // Nothing to do in the transaction just opened: the answer need not wait for its ROLLBACK.
      void this.abandon(runner);
      return { claim };
    }
    if (holdsKeyLock && !lockTaken(results[4])) return this.notRun(runner, request);
    return {
      claim,
      attempt: this.openAttempt(runner, request, {
        inTransaction: mode === 'request-transaction',
        writesRow: claimFunction === 'claim_in_transaction',
        holdsKeyLock,
      }),
    };
  }

  /**
   * Whether the work's transactions run at READ COMMITTED (or READ UNCOMMITTED, the same in PostgreSQL): the data
   * source's `isolationLevel`, else the default a connection of its pool gets (the server's, the database's, the
   * role's or the connection's own), read once.
   */
  private businessReadCommitted(): Promise<boolean> {
    this.readCommitted ??= (async () => {
      const level = this.dataSource.options.isolationLevel;
      if (level) return level === 'READ COMMITTED' || level === 'READ UNCOMMITTED';
      const { rows } = await this.run('SHOW default_transaction_isolation', [], { source: this.dataSource });
      const shown = (rows as Array<{ default_transaction_isolation: string }>)[0]?.default_transaction_isolation;
      return shown === 'read committed' || shown === 'read uncommitted';
    })().catch((error: unknown) => {
      this.readCommitted = undefined;
      throw error;
    });
    return this.readCommitted;
  }

  private readCommitted?: Promise<boolean>;

  /**
   * The key's lock, taken by a separate attempt's own transaction when that runs under REPEATABLE READ or
   * SERIALIZABLE. There a heartbeat renewal would change the key's row after the work's snapshot, and the
   * completion would then fail (a serialization failure): the attempt's transaction holds the key's lock instead,
   * which every claim that would take the key over needs. A live attempt is then never taken over, a dead one's
   * lock goes with its connection, and a hung one is ended at `maxHold`.
   */
  private holdKeyLockStatement(request: ClaimRequest): PipelinedStatement {
    return { text: this.sql.holdKeyLock, values: [request.tenant, request.key] };
  }

  /** The claim is this attempt's, but its transaction could not hold the key's lock: give it back, run nothing. */
  private async notRun(runner: QueryRunner, request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    await this.abandon(runner);
    await this.release(request).catch(() => false);
    return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
  }

  /**
   * A separate claim on the claim pool, then the work's BEGIN once the main
   * pool lends a connection. That wait has no heartbeat: when it outlasted a
   * third of the lease, the lease is renewed, fenced, before the work starts
   * (the engine's heartbeat then beats within the lease). A claim taken over
   * meanwhile is not run: its key is another attempt's now, in flight.
   */
  private async beginAfterClaimPool(request: ClaimRequest): Promise<BeginResult<EntityManager>> {
    const claimedAt = performance.now();
    const claim = await this.claim(request);
    this.noteClaim(claim);
    if (claim.state !== 'claimed') return { claim };
    const runner = this.dataSource.createQueryRunner();
    let stillOurs = true;
    let holdsKeyLock: boolean;
    try {
      holdsKeyLock = !(await this.businessReadCommitted());
      await runner.startTransaction();
      if (performance.now() - claimedAt > request.leaseMs / 3) stillOurs = await this.renewLease(request, request.leaseMs);
      if (stillOurs && holdsKeyLock) {
        const { text, values } = this.holdKeyLockStatement(request);
        const { rows } = await this.run(text, values!, { tx: runner.manager });
        if (!(rows as Array<{ locked: boolean }>)[0]?.locked) return await this.notRun(runner, request);
      }
    } catch (error) {
      await this.abandon(runner, error);
      // The work never ran: give the claim back, so a retry need not wait out the lease.
      await this.release(request).catch(() => false);
      throw error;
    }
    if (!stillOurs) {
      void this.abandon(runner);
      return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
    }
    return { claim, attempt: this.openAttempt(runner, request, { holdsKeyLock }) };
  }

  /**
   * The end of an attempt begun on `runner`: the completion and the COMMIT in one round trip.
   *
   * @param how.inTransaction a request-transaction claim: its work runs after a savepoint
   * @param how.writesRow the claim wrote no row (`claim_in_transaction`): the completion writes it
   * @param how.holdsKeyLock the transaction holds the key's lock (see `holdKeyLockStatement`): its lease needs no renewal
   */
  private openAttempt(
    runner: QueryRunner,
    request: ClaimRequest,
    how: { inTransaction?: boolean; writesRow?: boolean; holdsKeyLock?: boolean } = {},
  ): OpenAttempt<EntityManager> {
    const { inTransaction = false, writesRow = false, holdsKeyLock = false } = how;
    if (holdsKeyLock) this.lockedAttempts.add(request.ownerToken);
    let ended = false;
    /** The completion is on its way: too late to abort. */
    let committing = false;
    let aborted = false;
    let openedAt = performance.now();
    // A distinct value per open attempt: it is the attempt's entry in openAttempts.
    while (this.openAttempts.has(openedAt)) openedAt += 1e-6;
    this.openAttempts.add(openedAt);
    const end = async (failure?: unknown) => {
      ended = true;
      this.recordHold(openedAt, request.ownerToken);
      await this.abandon(runner, failure);
    };
    return {
      tx: runner.manager,
      holdsKeyLock,
      commit: async (response, ttlMs) => {
        if (aborted) return false;
        if (ended) throw new Error('This attempt has already ended.');
        committing = true;
        /** The COMMIT answered ROLLBACK (the completion before it failed): the transaction has ended on the server. */
        let rolledBack = false;
        try {
          await this.fusing(runner, 'COMMIT', async (client) => {
            const [completion, commit] = await this.exchange(
              client,
              [this.completionStatement(request, response, ttlMs, writesRow), { text: 'COMMIT' }],
              this.dataSource,
              runner,
            );
            rolledBack = !completion.ok && commit.ok;
            if (!completion.ok) throw completion.error;
            if (!commit.ok) throw commit.error;
          });
          ended = true;
          this.recordHold(openedAt, request.ownerToken);
          await runner.release();
          return true;
        } catch (error) {
          // TypeORM's commitTransaction threw, so its subscribers were told of no commit, and the rollback below tells
          // them of the rollback: sent only when the server still has the transaction (another ROLLBACK would be a
          // round trip and a warning in the server's log).
          if (rolledBack) await this.fusing(runner, 'ROLLBACK', async () => undefined).catch(() => undefined);
          await end(error);
          if (isFenceLost(error)) return false;
          throw error;
        }
      },
      rollback: async (keepClaim) => {
        if (ended || aborted) return false;
        if (keepClaim && inTransaction) {
          try {
            const client = (await runner.connect()) as PgClient;
            const [undone] = await this.exchange(
              client,
              [{ text: `ROLLBACK TO SAVEPOINT ${WORK_SAVEPOINT}` }],
              this.dataSource,
              runner,
            );
            if (undone.ok) return true;
            if (this.isUnavailableError(undone.error)) {
              await end(undone.error);
              throw undone.error;
            }
          } catch (error) {
            if (this.isUnavailableError(error)) {
              if (!ended) await end(error);
              throw error;
            }
          }
        }
        ended = true;
        this.recordHold(openedAt, request.ownerToken);
        try {
          if (runner.isTransactionActive) await runner.rollbackTransaction();
        } catch (error) {
          if (this.isUnavailableError(error)) throw error;
        } finally {
          if (!runner.isReleased) await runner.release();
        }
        return false;
      },
      abort: async () => {
        if (ended || committing || aborted) return;
        aborted = true;
        // The work may be anywhere: waiting on another system (its connection idle in the transaction) or inside a
        // statement of its own. Ending its server process ends both, rolls the transaction back and frees the key's
        // lock; the work's next statement fails, and its connection is dropped rather than lent again.
        const pid = (runner as unknown as { databaseConnection?: { processID?: number } }).databaseConnection?.processID;
        if (pid !== undefined) {
          await this.run('SELECT pg_terminate_backend($1)', [pid], { source: this.claims }).catch(() => undefined);
        }
        await end(Object.assign(new Error('The attempt held its key past maxHold and was ended.'), { code: ADMIN_SHUTDOWN }));
      },
    };
  }

  /**
   * Runs TypeORM's `runner.startTransaction()`, `commitTransaction()` or
   * `rollbackTransaction()` with its one statement (`START TRANSACTION`,
   * `COMMIT`, `ROLLBACK`) replaced by `send`, so the app's transaction
   * subscribers and TypeORM's own bookkeeping see the transaction as usual,
   * while the statement travels in one round trip with the module's (or, for a
   * transaction the server has already ended, not at all).
   */
  private async fusing(
    runner: QueryRunner,
    statement: 'START TRANSACTION' | 'COMMIT' | 'ROLLBACK',
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
      else if (statement === 'COMMIT') await runner.commitTransaction();
      else await runner.rollbackTransaction();
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

  private recordHold(startedAt: number, ownerToken?: string): void {
    if (ownerToken !== undefined) this.lockedAttempts.delete(ownerToken);
    this.openAttempts.delete(startedAt);
    const held = performance.now() - startedAt;
    this.holdMs = Number.isFinite(this.holdMs) ? this.holdMs * 0.9 + held * 0.1 : held;
  }

  /** Owner tokens of open attempts whose transaction holds the key's lock (see `holdKeyLockStatement`). */
  private readonly lockedAttempts = new Set<string>();

  /** Renews the lease, fenced; an attempt whose transaction holds the key's lock keeps the key without a write. */
  override async renewLease(ref: ClaimRef, leaseMs: number): Promise<boolean> {
    if (this.lockedAttempts.has(ref.ownerToken)) return true;
    const { affected } = await this.run(this.sql.renewLease, [ref.tenant, ref.key, ref.ownerToken, leaseMs], { write: true });
    return affected === 1;
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
    const name = this.options.preparedStatements ? this.statementName('complete') : undefined;
    try {
      const { rows } = await this.run(this.sql.complete, params, tx ? { tx, name } : { write: true, name });
      return (rows as Array<{ completed: boolean }>)[0]?.completed === true;
    } catch (error) {
      if (isFenceLost(error)) return false;
      throw error;
    }
  }

  async recordPhase(ref: ClaimRef, phases: PhaseState, leaseMs: number, tx?: EntityManager): Promise<boolean> {
    const params = [ref.tenant, ref.key, ref.ownerToken, phases.recoveryPoint, JSON.stringify(phases.results), leaseMs];
    try {
      return (await this.run(this.sql.recordPhase, params, tx ? { tx } : { write: true })).affected === 1;
    } catch (error) {
      if (isFenceLost(error)) return false;
      throw error;
    }
  }

  /**
   * Gives the claim back when the work never ran (or was rejected before it
   * started): a fresh claim is deleted, a takeover's lease ends with its
   * history kept (see the `release` statement).
   */
  async release(ref: ClaimRef, forget = false): Promise<boolean> {
    const params = [ref.tenant, ref.key, ref.ownerToken];
    if (forget) return (await this.run(this.sql.forget, params, { write: true })).affected === 1;
    const { rows } = await this.run(this.sql.release, params, { write: true });
    return Number((rows as Array<{ released: string | number }>)[0]?.released ?? 0) > 0;
  }

  /**
   * Ends the lease of the attempt holding `ownerToken` and fences it with a
   * new token (an operator's release, from the board): the next retry takes
   * the key over at once.
   * @returns the attempt's key, or undefined when it no longer holds one
   */
  async endLease(tenant: string, ownerToken: string): Promise<string | undefined> {
    const { rows } = await this.run(this.sql.endLease, [tenant, ownerToken], { write: true });
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
          const [batch] = (await this.run(this.sql.sweepBatch, params, { source: this.dataSource, write: true })).rows as Array<{
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
    const [row] = (await this.run(this.sql.countExpired, [limit], { source: this.dataSource })).rows as Array<{
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
   * this one statement (by default the claim pool). A `write` outside a
   * transaction runs in one of its own at READ COMMITTED, in the same round
   * trip: on its own it would inherit the server's default isolation level,
   * and under REPEATABLE READ a row another connection just changed is a
   * serialization failure instead of the latest version to decide on.
   * TypeORM's query path is skipped, since for these short statements it
   * costs more app CPU than the statement does; each is still logged through
   * the data source's logger, and its parameters (keys, tenants, bodies)
   * reach neither a log nor the error it throws (see redacting-logger.ts).
   */
  private async run(
    sql: string,
    params: unknown[],
    options: { tx?: EntityManager; source?: DataSource; write?: boolean; name?: string } = {},
  ): Promise<{ rows: unknown[]; affected: number }> {
    const runner = options.tx?.queryRunner;
    const source = options.source ?? (runner ? this.dataSource : this.claims);
    const statement: PipelinedStatement = { text: sql, values: params, ...(options.name ? { name: options.name } : {}) };
    const [client, release] = runner ? [(await runner.connect()) as PgClient, undefined] : await this.connection(source);
    let failure: unknown;
    try {
      const statements = !runner && options.write ? [{ text: BEGIN_READ_COMMITTED }, statement, { text: 'COMMIT' }] : [statement];
      const results = await this.exchange(client, statements, source, runner);
      const answered = answerOf(results[statements.indexOf(statement)]);
      answerOf(results[statements.length - 1]);
      return { rows: answered.rows, affected: answered.rowCount ?? 0 };
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      // A connection that failed is dropped from the pool rather than handed to the next caller.
      release?.(failure !== undefined && this.isUnavailableError(failure) ? failure : undefined);
    }
  }

  /** A connection of `source`'s pool, and how to give it back (with the error that killed it, to drop it). */
  private async connection(source: DataSource): Promise<[PgClient, (error?: unknown) => void]> {
    return (await (source.driver as unknown as PgDriver).obtainMasterConnection()) as [PgClient, (error?: unknown) => void];
  }

  /** One name per statement text, so stores of different tables never collide on a connection. */
  private statementName(name: 'claim' | 'claim_in_transaction' | 'complete' | 'complete_or_raise'): string {
    return `nest_idem_${name}_${createHash('sha1').update(this.table).digest('hex').slice(0, 12)}`;
  }
}
