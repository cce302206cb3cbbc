import type { ClaimRequest, ClaimResult, StoredResponse } from '../../core/idempotency-store.js';
import { claimAnswered } from './claim-answered.js';
import { completeInTransaction } from './complete-in-transaction.js';
import { statementName } from './prepared-statement-name.js';
import type { ClaimFunction, ClaimRow } from './claim-row.js';
import type { PipelinedStatement } from './pipeline-types.js';
import type { KeyStatements } from './statements.js';

/**
 * The claim and completion calls on one key table (`KeyStatements.claims`), every value a parameter. With
 * `preparedStatements` they get a name; that is all the option changes.
 */
export class ClaimStatements {
  constructor(
    private readonly sql: KeyStatements['sql'],
    private readonly table: string,
    private readonly options: { preparedStatements: boolean },
  ) {}

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
      ...(this.options.preparedStatements ? { name: statementName(this.table, name) } : {}),
    };
  }

  /** The completion sent with an open attempt's COMMIT: a lost fence raises, so the COMMIT behind it answers ROLLBACK. */
  completion(request: ClaimRequest, response: StoredResponse, ttlMs: number, writesRow: boolean): PipelinedStatement {
    if (writesRow) return completeInTransaction(this.sql.completeInTransaction, request, response, ttlMs);
    const headers = JSON.stringify(response.headers);
    return {
      text: this.sql.completeOrRaise,
      values: [request.tenant, request.key, request.ownerToken, response.status, headers, response.body, ttlMs],
      ...(this.options.preparedStatements ? { name: statementName(this.table, 'complete_or_raise') } : {}),
    };
  }
}

/** What the claim function's row says, as the engine reads it. */
export function claimResult(row: ClaimRow | undefined, request: ClaimRequest): ClaimResult {
  if (row?.state !== 'claimed') return claimAnswered(row);
  return {
    state: 'claimed',
    attempt: row.attempt,
    generation: row.generation ?? request.ownerToken,
    phases: { recoveryPoint: row.recovery_point, results: row.phase_results ? JSON.parse(row.phase_results) : {} },
  };
}
