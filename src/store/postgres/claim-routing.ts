import { performance } from 'node:perf_hooks';
import type { SourceDataSource } from '../connection.js';
import type { ClaimResult } from '../../core/idempotency-store.js';

/** Past this share of claims answered without claiming, the claim pool is asked first (see `answeredShare`). */
const MOSTLY_ANSWERED = 0.5;

/** Longest expected wait for a business connection at which the claim still goes on it (see `mainPoolHasRoom`). */
const FUSED_CLAIM_MAX_WAIT_MS = 10;

/** The pg Pool under TypeORM's postgres driver, as far as the routing looks at it. */
interface PgPool {
  idleCount: number;
  totalCount: number;
  waitingCount: number;
  options: { max: number };
}

/**
 * Where a separate claim goes: on the main pool's connection the work then
 * uses (a pool checkout fewer; where the work runs under REPEATABLE READ or
 * SERIALIZABLE, a round trip fewer, its BEGIN in the claim's message), or
 * first on the claim pool, so that replays and 409s never queue behind
 * business transactions. It decides from how busy the main pool is and how
 * long its transactions hold a connection, and for the claim that opens the
 * work's transaction in its message, from how many recent claims were
 * answered without claiming.
 */
export class ClaimRouting {
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

  /** When each attempt still open on the business pool began. */
  private readonly openAttempts = new Set<number>();

  /** How long the work's transactions hold their connection, a moving average (starts pessimistic: the claim pool). */
  private holdMs = Number.POSITIVE_INFINITY;

  constructor(
    private readonly main: SourceDataSource,
    private readonly claimPool: SourceDataSource,
  ) {}

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

  /**
   * Whether the claim can go on the business connection without keeping a
   * replay or a 409 waiting long: the main pool has a connection free, or
   * its queue moves fast. A caller would wait about (queue + 1) / pool size
   * of the time a business transaction holds its connection: under fast
   * handlers that is a few milliseconds, and the claim on the work's own
   * connection saves a pool checkout; under slow ones (every connection held
   * for 200 ms) the claim pool answers at once instead.
   */
  mainPoolHasRoom(): boolean {
    if (this.claimPool === this.main) return true;
    const pool = (this.main.driver as unknown as { master?: PgPool }).master;
    if (!pool?.options) return true;
    if (pool.waitingCount === 0 && (pool.idleCount > 0 || pool.totalCount < pool.options.max)) return true;
    const expectedWaitMs = ((pool.waitingCount + 1) / pool.options.max) * this.holdMs;
    if (expectedWaitMs > FUSED_CLAIM_MAX_WAIT_MS) return false;
    // The average only learns of slow transactions once they end. The queue has stalled when even the attempt opened
    // last has been open for longer than the bound: none is then known to move. (Any one old attempt is not enough:
    // under steady load some always are while new ones open every few milliseconds, and every new key would pay the
    // claim pool's extra round trip.)
    const now = performance.now();
    let youngest = Number.POSITIVE_INFINITY;
    for (const openedAt of this.openAttempts) youngest = Math.min(youngest, now - openedAt);
    return youngest <= FUSED_CLAIM_MAX_WAIT_MS;
  }
}
