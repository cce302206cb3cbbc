import { createHash } from 'node:crypto';
import type { ClaimRef, ClaimRequest, ClaimResult, StoredResponse } from '../../core/idempotency-store.js';
import { FENCE_LOST_SQLSTATE } from '../key-function-parts.sql.js';
import { keyStoreStatements, type READ_COMMITTED_NEEDED } from '../key-store.sql.js';
import { keyUpkeepStatements } from '../key-upkeep.sql.js';
import type { PipelinedResult, PipelinedStatement } from './pipelined.js';
import { citusKeyStatements } from '../citus/citus.sql.js';

/**
 * Opens the claim's own transaction, and an autocommit write's: READ COMMITTED
 * whatever default the server, the database, the role or the connection sets.
 */
export const BEGIN_READ_COMMITTED = 'BEGIN ISOLATION LEVEL READ COMMITTED';

/** The savepoint after a request-transaction claim: undoing the work back to it keeps the claim and its lock. */
export const WORK_SAVEPOINT = 'nest_idempotency_work';

/** SQLSTATE of a serialization failure (REPEATABLE READ, SERIALIZABLE): a row changed after the snapshot. */
export const SERIALIZATION_FAILURE = '40001';

/** The key table's claim functions: `claim` commits on its own or joins a transaction; `claim_in_transaction` only joins one. */
export type ClaimFunction = 'claim' | 'claim_in_transaction';

/** The row a claim function answers. */
export interface ClaimRow {
  /** `read_committed_needed`: a claim sent alone that would have written under another level (separate-claim.ts). */
  state: 'claimed' | 'in_flight' | 'completed' | 'mismatch' | typeof READ_COMMITTED_NEEDED;
  attempt: number;
  generation: string | null;
  retry_after: number | null;
  response_status: number | null;
  response_headers: Array<[string, string]> | null;
  response_body: Buffer | null;
  recovery_point: string | null;
  phase_results: string | null;
}

/**
 * The module's statements on one key table, every value a parameter. With
 * `preparedStatements`, the claim and the completion calls get a name; that
 * is all the option changes.
 */
export class KeyStatements {
  /** The statements' texts (see key-store.sql.ts and key-upkeep.sql.ts). */
  readonly sql: {
    readonly [K in keyof ReturnType<typeof keyStoreStatements> | keyof ReturnType<typeof keyUpkeepStatements>]: string;
  };

  constructor(
    private readonly table: string,
    tableName: string,
    private readonly options: { preparedStatements: boolean; partitioned: boolean; citus?: boolean },
  ) {
    const sql = { ...keyStoreStatements(table, tableName), ...keyUpkeepStatements(table) };
    // Citus (prototype, issue 31): the writes the coordinator refuses, and the key lock it would take on itself, go
    // through the functions delegated to the tenant's worker.
    this.sql = options.citus ? { ...sql, ...citusKeyStatements(table) } : sql;
  }

  /** The key table is distributed on Citus (the module option `citus`). */
  get citus(): boolean {
    return Boolean(this.options.citus);
  }

  /** The claim function of claim mode `request-transaction`: the partitioned table's one claim takes both modes. */
  get inTransactionClaim(): ClaimFunction {
    return this.options.partitioned ? 'claim' : 'claim_in_transaction';
  }

  /** The call of a claim function. */
  claim(request: ClaimRequest, name: ClaimFunction, lockTimeoutMs: number | null): PipelinedStatement {
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

  /** The fenced completion `complete` sends: it answers whether the key was still this attempt's. */
  complete(ref: ClaimRef, response: StoredResponse, ttlMs: number): PipelinedStatement {
    return {
      text: this.sql.complete,
      values: [ref.tenant, ref.key, ref.ownerToken, response.status, JSON.stringify(response.headers), response.body, ttlMs],
      ...(this.options.preparedStatements ? { name: this.statementName('complete') } : {}),
    };
  }

  /**
   * The completion sent with an open attempt's COMMIT: a lost fence raises, so the COMMIT behind it in the same
   * message answers ROLLBACK. A request-transaction claim that wrote no row (`claim_in_transaction`) writes it here.
   */
  completion(request: ClaimRequest, response: StoredResponse, ttlMs: number, writesRow: boolean): PipelinedStatement {
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

  /** One name per statement text, so stores of different tables never collide on a connection. */
  private statementName(name: ClaimFunction | 'complete' | 'complete_or_raise'): string {
    return `nest_idem_${name}_${createHash('sha1').update(this.table).digest('hex').slice(0, 12)}`;
  }
}

/** What the claim function's row says, as the engine reads it. */
export function claimResult(row: ClaimRow | undefined, request: ClaimRequest): ClaimResult {
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
        // The claim functions of this version answer a completed key with the seconds its record has left here.
        recordExpiresInSeconds: row.retry_after ?? undefined,
      };
    default:
      return { state: 'in-flight', retryAfterSeconds: 1 };
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
