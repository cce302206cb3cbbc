import type { ClaimRequest, StoredResponse } from '../../core/idempotency-store.js';
import type { PipelinedStatement } from './pipeline-types.js';

/** The completion of a request-transaction claim that wrote no row (`claim_in_transaction`): it writes it. */
export function completeInTransaction(
  text: string,
  request: ClaimRequest,
  response: StoredResponse,
  ttlMs: number,
): PipelinedStatement {
  return {
    text,
    values: [
      request.tenant,
      request.key,
      request.fingerprint,
      request.ownerToken,
      response.status,
      JSON.stringify(response.headers),
      response.body,
      ttlMs,
    ],
  };
}
