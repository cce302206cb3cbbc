import { performance } from 'node:perf_hooks';

/** Longest expected wait for a business connection at which the claim still goes on it (see `queueMovesFast`). */
const FUSED_CLAIM_MAX_WAIT_MS = 10;

/** The pg Pool under TypeORM's postgres driver, as far as the routing looks at it. */
export interface PoolLoad {
  idleCount: number;
  totalCount: number;
  waitingCount: number;
  options: { max: number };
}

/**
 * The main pool has no connection free: whether its queue moves fast enough for the claim to wait in it (a caller
 * waits about (queue + 1) / pool size of `holdMs`, the time a business transaction holds its connection).
 */
export function queueMovesFast(pool: PoolLoad, holdMs: number, openAttempts: ReadonlySet<number>): boolean {
  const expectedWaitMs = ((pool.waitingCount + 1) / pool.options.max) * holdMs;
  if (expectedWaitMs > FUSED_CLAIM_MAX_WAIT_MS) return false;
  // The average only learns of slow transactions once they end. The queue has stalled when even the attempt opened
  // last has been open for longer than the bound: none is then known to move. (Any one old attempt is not enough:
  // under steady load some always are while new ones open every few milliseconds, and every new key would pay the
  // claim pool's extra round trip.)
  const now = performance.now();
  let youngest = Number.POSITIVE_INFINITY;
  for (const openedAt of openAttempts) youngest = Math.min(youngest, now - openedAt);
  return youngest <= FUSED_CLAIM_MAX_WAIT_MS;
}
