import type { ClaimRef, ClaimRequest, StoredResponse } from '../../core/idempotency-store.js';
import { FENCE_LOST_SQLSTATE } from '../key-function-parts.sql.js';
import { keyStoreStatements } from '../key-store.sql.js';
import { keyUpkeepStatements } from '../key-upkeep.sql.js';
import { citusKeyStatements } from '../citus/citus.sql.js';
import type { ClaimFunction } from './claim-row.js';
import { ClaimStatements } from './claim-statements.js';
import { statementName } from './prepared-statement-name.js';
import type { PipelinedResult, PipelinedStatement } from './pipeline-types.js';

/**
 * Opens the claim's own transaction, and an autocommit write's: READ COMMITTED
 * whatever default the server, the database, the role or the connection sets.
 */
export const BEGIN_READ_COMMITTED = 'BEGIN ISOLATION LEVEL READ COMMITTED';

/** The savepoint after a request-transaction claim: undoing the work back to it keeps the claim and its lock. */
export const WORK_SAVEPOINT = 'nest_idempotency_work';

/** SQLSTATE of a serialization failure (REPEATABLE READ, SERIALIZABLE): a row changed after the snapshot. */
export const SERIALIZATION_FAILURE = '40001';

/** The module's statements on one key table; the claim and completion calls: `claims` (`ClaimStatements`). */
export class KeyStatements {
  /** The statements' texts (see key-store.sql.ts and key-upkeep.sql.ts). */
  readonly sql: {
    readonly [K in keyof ReturnType<typeof keyStoreStatements> | keyof ReturnType<typeof keyUpkeepStatements>]: string;
  };
  /** The claim and completion calls, the ones a new key sends. */
  readonly claims: ClaimStatements;

  constructor(
    private readonly table: string,
    tableName: string,
    private readonly options: { preparedStatements: boolean; partitioned: boolean; citus?: boolean },
  ) {
    const sql = { ...keyStoreStatements(table, tableName), ...keyUpkeepStatements(table) };
    // Citus (prototype, issue 31): the writes the coordinator refuses, and the key lock it would take on itself, go
    // through the functions delegated to the tenant's worker.
    this.sql = options.citus ? { ...sql, ...citusKeyStatements(table) } : sql;
    this.claims = new ClaimStatements(this.sql, table, options);
  }

  /** The key table is distributed on Citus (the module option `citus`). */
  get citus(): boolean {
    return Boolean(this.options.citus);
  }

  /** The claim function of claim mode `request-transaction`: the partitioned table's one claim takes both modes. */
  get inTransactionClaim(): ClaimFunction {
    return this.options.partitioned ? 'claim' : 'claim_in_transaction';
  }

  /** The fenced completion `complete` sends: it answers whether the key was still this attempt's. */
  complete(ref: ClaimRef, response: StoredResponse, ttlMs: number): PipelinedStatement {
    return {
      text: this.sql.complete,
      values: [ref.tenant, ref.key, ref.ownerToken, response.status, JSON.stringify(response.headers), response.body, ttlMs],
      ...(this.options.preparedStatements ? { name: statementName(this.table, 'complete') } : {}),
    };
  }

  /**
   * The key's lock, taken by a separate attempt's own transaction when that runs under REPEATABLE READ or
   * SERIALIZABLE. There a heartbeat renewal would change the key's row after the work's snapshot, and the
   * completion would then fail (a serialization failure): the attempt's transaction holds the key's lock instead,
   * which every claim that would take the key over needs. A live attempt is then never taken over, a dead one's
   * lock goes with its connection, and a hung one is ended at `maxHold`.
   */
  holdKeyLock(request: ClaimRequest): PipelinedStatement {
    return { text: this.sql.holdKeyLock, values: [request.tenant, request.key] };
  }

  /**
   * Whether a request-transaction claim holds the key's lock for its session as well as its transaction (the plain
   * table on one server: see HOLD_FOR_SESSION in request-transaction-key.sql.ts), so that a stored failure needs no
   * savepoint. The partitioned table's claim writes its in-flight row in the transaction, and Citus lends the worker's
   * connections to other sessions: both keep the savepoint.
   */
  get holdsKeyForSession(): boolean {
    return !this.options.partitioned && !this.options.citus;
  }

  /**
   * Whether a separate claim may be sent alone, as its own transaction (see separate-claim.ts): the plain table's
   * claim on one server checks its isolation level before it writes. The partitioned table's claim and the Citus
   * texts do not, and Citus delegates a call differently inside a transaction block.
   */
  get claimCommitsAlone(): boolean {
    return !this.options.partitioned && !this.options.citus;
  }

  /** Lets go of the key's lock held for the session (`holdsKeyForSession`); answers `released`. */
  releaseKeyLock(request: ClaimRequest): PipelinedStatement {
    return { text: this.sql.releaseKeyLock, values: [request.tenant, request.key] };
  }
}

export function sqlState(error: unknown): unknown {
  return (error as { code?: unknown } | undefined)?.code;
}

/** Whether a fenced statement of the module failed because the key is no longer this attempt's. */
export function isFenceLost(error: unknown): boolean {
  return sqlState(error) === FENCE_LOST_SQLSTATE;
}

/** Whether a `holdKeyLock` statement answered that the lock was taken. */
export function lockTaken(result: PipelinedResult | undefined): boolean {
  return result?.ok === true && (result.rows[0] as { locked?: boolean } | undefined)?.locked === true;
}
