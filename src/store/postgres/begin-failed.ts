import type { SourceQueryRunner } from '../connection.js';
import type { ClaimRequest } from '../../core/idempotency-store.js';
import { endAndRelease } from './end-and-release.js';
import type { PipelinedResult } from './pipeline-types.js';

/**
 * The work never ran: its connection ends, and the claim is given back if the store still answers, so a retry need
 * not wait out the lease.
 */
export async function giveBackClaim(
  store: { release(request: ClaimRequest): Promise<boolean> },
  runner: SourceQueryRunner,
  request: ClaimRequest,
  error: unknown,
): Promise<never> {
  await endAndRelease(runner, error);
  await store.release(request).catch(() => false);
  throw error;
}

/** The separate claim or its COMMIT failed (the COMMIT answered ROLLBACK): nothing committed, the connection is idle. */
export async function claimFailed(
  runner: SourceQueryRunner,
  claimed: PipelinedResult,
  committed: PipelinedResult,
): Promise<never> {
  await runner.release();
  throw claimed.ok ? (committed as { error: unknown }).error : claimed.error;
}
