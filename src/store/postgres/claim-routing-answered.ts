import type { ClaimResult } from '../../core/idempotency-store.js';
import { ClaimRouting } from './claim-routing.js';

/** Past this share of claims answered without claiming, the claim pool is asked first (see `answeredShare`). */
const MOSTLY_ANSWERED = 0.5;

/** `ClaimRouting`, and for a claim whose message opens the work's transaction, the share of claims answered. */
export class AnsweredShareRouting extends ClaimRouting {
  /**
   * The share of recent separate claims answered without a claim (replays,
   * 409s, 422s), a moving average. Where the work runs under REPEATABLE READ
   * or SERIALIZABLE, the claim's message opens the work's transaction and
   * takes the key's lock in it (see `KeyStatements.holdKeyLock`), so for those
   * it opened a transaction for nothing, rolled back after the answer: while
   * they are most of the traffic (a retry storm, a replaying client), such
   * claims go to the claim pool first, one round trip each and no
   * transaction. (At READ COMMITTED the claim opens no transaction; its BEGIN
   * waits for the work's first statement.)
   */
  private answeredShare = 0;

  /**
   * Whether a separate claim whose message would open the work's transaction
   * (the work under REPEATABLE READ or SERIALIZABLE) goes to the claim pool
   * first, its BEGIN on the main pool after it.
   */
  claimPoolFirst(): boolean {
    return this.answeredShare > MOSTLY_ANSWERED || !this.mainPoolHasRoom();
  }

  /** Counts a separate claim's answer into `answeredShare` (read by `claimPoolFirst` only). */
  noteClaim(claim: ClaimResult): void {
    this.answeredShare = this.answeredShare * 0.95 + (claim.state === 'claimed' ? 0 : 0.05);
  }
}
