import type { ClaimResult } from '../../core/idempotency-store.js';
import type { ClaimRow } from './claim-row.js';

/** A claim function's row that claimed nothing (see `claimResult`), as the engine reads it. */
export function claimAnswered(row: ClaimRow | undefined): ClaimResult {
  switch (row?.state) {
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
