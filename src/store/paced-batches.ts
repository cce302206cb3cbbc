import type { SweepOptions } from '../core/idempotency-store.js';

/**
 * Deletes in batches until one comes back short or the run's time is up,
 * resting after each batch as `dutyCycle` says, so the database's CPU and
 * I/O stay with requests. At least one batch per run, so a tight budget
 * still makes progress.
 *
 * @param deleteBatch deletes at most `options.batchSize` rows and says how many; or how many it deleted and how many
 *   it found to delete, when the two can differ (Citus: a row renewed meanwhile is found, then kept), since only a
 *   batch that found fewer than `batchSize` says the backlog is done
 * @param startedAt when the run began (`Date.now()`), for `maxDurationMs`
 */
export async function deleteInPacedBatches(
  deleteBatch: () => Promise<number | { deleted: number; candidates: number }>,
  options: SweepOptions,
  startedAt: number,
): Promise<{ deleted: number; batches: number; restedMs: number }> {
  const duty = options.dutyCycle ?? 1;
  let deleted = 0;
  let batches = 0;
  let rested = 0;
  for (;;) {
    const batchStarted = Date.now();
    const batch = await deleteBatch();
    const { deleted: count, candidates } = typeof batch === 'number' ? { deleted: batch, candidates: batch } : batch;
    batches++;
    deleted += count;
    if (candidates < options.batchSize) break;
    const rest = duty < 1 ? ((Date.now() - batchStarted) * (1 - duty)) / duty : 0;
    if (Date.now() + rest - startedAt >= options.maxDurationMs) break;
    if (rest > 0) {
      await new Promise((resolve) => setTimeout(resolve, rest));
      rested += rest;
    }
  }
  return { deleted, batches, restedMs: Math.round(rested) };
}
