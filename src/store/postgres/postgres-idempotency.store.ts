import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../connection.js';
import { IdempotencyStore } from '../../core/idempotency-store.js';
import type {
  BeginResult,
  ClaimMode,
  ClaimRef,
  ClaimRequest,
  ClaimResult,
  PhaseState,
  StoredResponse,
  SweepOptions,
  SweepResult,
} from '../../core/idempotency-store.js';
import { quoteTableName } from '../identifiers.js';
import { PartitionRetention, type PartitionStatus } from '../partitioned/partition-retention.js';
import type { AttemptParts } from './attempt-parts.js';
import { ClaimAndBegin } from './claim-and-begin.js';
import { RequestTransactionBegin } from './request-transaction.js';
import { AnsweredShareRouting } from './claim-routing-answered.js';
import { SeparateClaim } from './separate-claim.js';
import { Pools } from './pools.js';
import { claim, complete } from './claim-and-complete.js';
import type { PostgresIdempotencyStoreOptions } from './postgres-store-options.js';
import { KeyStatements } from './statements.js';
import { countExpiredKeys, sweepExpiredKeys, type SweptTable } from './sweep.js';
import { isUnavailableError } from './unavailable.js';
import { endLease, recordPhase, release, renewLease } from './key-upkeep.js';
import { storeTransaction } from './store-transaction.js';

/**
 * The key store on PostgreSQL through a TypeORM `DataSource`. Every statement
 * is plain SQL with positional parameters, so it works unchanged through
 * PgBouncer in transaction pooling (no named prepared statements unless asked
 * for, no session state). All time comparisons use the database clock.
 */
export class PostgresIdempotencyStore extends IdempotencyStore<EntityManager> {
  /** The key table, possibly schema-qualified, as given (unquoted). */
  readonly tableName: string;
  private readonly statements: KeyStatements;
  private readonly pools: Pools;
  /** Retention by partitions, for the partitioned table; undefined for the plain one. */
  private readonly partitions?: PartitionRetention;
  private readonly attemptParts: AttemptParts;
  private readonly claimAndBegin: ClaimAndBegin;
  private readonly requestTransaction: RequestTransactionBegin;
  private readonly sweptTable: SweptTable;

  constructor(dataSource: SourceDataSource, tableName: string, options: PostgresIdempotencyStoreOptions = {}) {
    super();
    const claimPool = options.claimDataSource ?? dataSource;
    const table = quoteTableName(tableName);
    this.tableName = tableName;
    if (options.partitioned) this.partitions = new PartitionRetention(dataSource, table);
    this.statements = new KeyStatements(table, tableName, {
      preparedStatements: Boolean(options.preparedStatements),
      partitioned: this.partitions !== undefined,
      citus: Boolean(options.citus),
    });
    this.pools = new Pools(dataSource, claimPool);
    this.attemptParts = {
      pools: this.pools,
      statements: this.statements,
      routing: new AnsweredShareRouting(dataSource, claimPool),
      keyLockHolders: new Set(),
      separateClaim: new SeparateClaim(this.statements),
    };
    this.claimAndBegin = new ClaimAndBegin(this, this.attemptParts);
    this.requestTransaction = new RequestTransactionBegin(
      this.attemptParts,
      { name: tableName, partitioned: this.partitioned },
      () => this.claimAndBegin.businessReadCommitted(),
    );
    this.sweptTable = { pools: this.pools, statements: this.statements, table, partitions: this.partitions };
    // Learnt now rather than on the first request's way (tried again there if this fails).
    if (dataSource.isInitialized) this.claimAndBegin.businessReadCommitted().catch(() => undefined);
  }

  /** Whether the key table is the partitioned one. */
  get partitioned(): boolean {
    return this.partitions !== undefined;
  }

  /** The partitioned table's partitions, for health checks; undefined for the plain table. */
  async partitionStatus(defaultRowsLimit: number): Promise<PartitionStatus | undefined> {
    return this.partitions?.status(defaultRowsLimit);
  }

  /** The claim and the work's BEGIN in one round trip (see `ClaimAndBegin`, `RequestTransactionBegin`). */
  override async begin(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs = 0): Promise<BeginResult<EntityManager>> {
    if (mode === 'request-transaction') return this.requestTransaction.begin(request, lockTimeoutMs);
    return this.claimAndBegin.begin(request);
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
    return claim(this.attemptParts, request, tx, lockTimeoutMs);
  }

  override async renewLease(ref: ClaimRef, leaseMs: number): Promise<boolean> {
    return renewLease(this.attemptParts, ref, leaseMs);
  }

  /** Like `DataSource.transaction`, with a failed ROLLBACK the store's failure (see store-transaction.ts). */
  async transaction<T>(work: (tx: EntityManager) => Promise<T>): Promise<T> {
    return storeTransaction(this.pools.main, work);
  }

  async complete(ref: ClaimRef, response: StoredResponse, ttlMs: number, tx?: EntityManager): Promise<boolean> {
    return complete(this.attemptParts, ref, response, ttlMs, tx);
  }

  async recordPhase(ref: ClaimRef, phases: PhaseState, leaseMs: number, tx?: EntityManager): Promise<boolean> {
    return recordPhase(this.attemptParts, ref, phases, leaseMs, tx);
  }

  /** Gives the claim back when the work never ran (see key-upkeep.ts). */
  async release(ref: ClaimRef, forget = false): Promise<boolean> {
    return release(this.attemptParts, ref, forget);
  }

  /** An operator's release (the board): ends the attempt's lease, fenced; answers its key (see key-upkeep.ts). */
  async endLease(tenant: string, ownerToken: string): Promise<string | undefined> {
    return endLease(this.attemptParts, tenant, ownerToken);
  }

  /** Deletes expired keys in paced batches under an advisory lock; the partitioned table retires partitions instead. */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    return sweepExpiredKeys(this.sweptTable, options);
  }

  override async countExpired(limit: number): Promise<number> {
    return countExpiredKeys(this.sweptTable, limit);
  }

  isUnavailableError(error: unknown): boolean {
    return isUnavailableError(error);
  }
}
