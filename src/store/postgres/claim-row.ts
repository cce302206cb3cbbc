import type { READ_COMMITTED_NEEDED } from '../key-store.sql.js';

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
