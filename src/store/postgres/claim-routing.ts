import { performance } from 'node:perf_hooks';
import type { SourceDataSource } from '../connection.js';
import { queueMovesFast, type PoolLoad } from './claim-routing-queue.js';

/**
 * Where a separate claim goes: on the main pool's connection the work then uses (a pool checkout fewer), or first on
 * the claim pool, so that replays and 409s never queue behind business transactions (see also `AnsweredShareRouting`).
 */
export class ClaimRouting {
  /** When each attempt still open on the business pool began. */
  private readonly openAttempts = new Set<number>();

  /** How long the work's transactions hold their connection, a moving average (starts pessimistic: the claim pool). */
  private holdMs = Number.POSITIVE_INFINITY;

  constructor(
    private readonly main: SourceDataSource,
    private readonly claimPool: SourceDataSource,
  ) {}

  /** An attempt opened on the business pool: returns its mark, for `attemptEnded`. */
  attemptOpened(): number {
    let openedAt = performance.now();
    // A distinct value per open attempt: it is the attempt's entry in openAttempts.
    while (this.openAttempts.has(openedAt)) openedAt += 1e-6;
    this.openAttempts.add(openedAt);
    return openedAt;
  }

  /** The attempt opened at `openedAt` gave its connection back: how long it held it goes into `holdMs`. */
  attemptEnded(openedAt: number): void {
    this.openAttempts.delete(openedAt);
    const held = performance.now() - openedAt;
    this.holdMs = Number.isFinite(this.holdMs) ? this.holdMs * 0.9 + held * 0.1 : held;
  }

  /** Whether the claim can go on the business connection without keeping a replay or a 409 waiting long. */
  mainPoolHasRoom(): boolean {
    if (this.claimPool === this.main) return true;
    const pool = (this.main.driver as unknown as { master?: PoolLoad }).master;
    if (!pool?.options) return true;
    if (pool.waitingCount === 0 && (pool.idleCount > 0 || pool.totalCount < pool.options.max)) return true;
    return queueMovesFast(pool, this.holdMs, this.openAttempts);
  }
}
