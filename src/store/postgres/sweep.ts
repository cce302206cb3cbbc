import type { SweepOptions, SweepResult } from '../../core/idempotency-store.js';
import { deleteInPacedBatches } from '../paced-batches.js';
import type { PartitionRetention } from '../partitioned/partition-retention.js';
import type { PgClient, Pools } from './pools.js';
import type { KeyStatements } from './statements.js';

/** Names the sweep's advisory lock, with the key table's oid after it. */
const SWEEP_LOCK_PREFIX = 'nest-idempotency:sweep:';

/** The key table a sweep works on. */
export interface SweptTable {
  pools: Pools;
  statements: KeyStatements;
  /** The key table, quoted. */
  table: string;
  /** Retention by partitions, for the partitioned table. */
  partitions?: PartitionRetention;
}

/**
 * Deletes expired keys (the partitioned table: retires partitions). One
 * lock-holding transaction on its own connection guards the whole run,
 * while each batch commits on its own, so deleted rows are released at once
 * and claims never wait behind a long sweep. `pg_try_advisory_xact_lock`
 * keeps this correct behind PgBouncer in transaction pooling, and a crashed
 * sweeper's lock goes with its connection.
 */
export async function sweepExpiredKeys(
  { pools, statements, table, partitions }: SweptTable,
  options: SweepOptions,
): Promise<SweepResult> {
  const started = Date.now();
  const lockRunner = pools.main.createQueryRunner();
  try {
    await lockRunner.startTransaction();
    const client = (await lockRunner.connect()) as PgClient;
    const [prefix, tableLiteral] = [SWEEP_LOCK_PREFIX, table].map((value) => client.escapeLiteral(value));
    // The table as PostgreSQL resolves it (its oid): same-named tables in two schemas are two sweeps, not one lock.
    // Literals, not parameters: a parameterised statement leaves its unnamed portal, and the portal's snapshot,
    // open until the next statement, and this transaction then sits idle for the whole run holding back the
    // xmin horizon: no VACUUM anywhere in the database could remove what the sweep deletes, and each batch
    // would walk the index entries of every row deleted before it (a 5M-row sweep slowed to a crawl).
    const [{ locked }] = (await lockRunner.query(
      `SELECT pg_try_advisory_xact_lock(hashtextextended(${prefix} || coalesce(to_regclass(${tableLiteral})::oid::text, ${tableLiteral}), 0)) AS locked`,
    )) as Array<{ locked: boolean }>;
    if (!locked) return { ran: false, deleted: 0, batches: 0, durationMs: Date.now() - started, restedMs: 0 };
    if (partitions) return await partitions.run(options);
    // Where along the expiry_floor index the next batch starts (see sweepBatch).
    let after = '-infinity';
    const run = await deleteInPacedBatches(
      async () => {
        const statement = { text: statements.sql.sweepBatch, values: [options.batchSize, after] };
        const [batch] = (await pools.run(statement, { source: pools.main, write: true })).rows as Array<{
          deleted: number;
          /** Only the Citus batch's (see citusKeyStatements). */
          candidates?: number;
          last: string | null;
        }>;
        if (batch.last !== null) after = batch.last;
        return batch.candidates === undefined ? batch.deleted : { deleted: batch.deleted, candidates: batch.candidates };
      },
      options,
      started,
    );
    return { ran: true, ...run, durationMs: Date.now() - started };
  } finally {
    if (lockRunner.isTransactionActive) await lockRunner.rollbackTransaction().catch(() => undefined);
    await lockRunner.release();
  }
}

/** Counts the expired keys waiting for the sweeper, at most `limit`. */
export async function countExpiredKeys({ pools, statements, partitions }: SweptTable, limit: number): Promise<number> {
  if (partitions) return partitions.countExpired(limit);
  const statement = { text: statements.sql.countExpired, values: [limit] };
  const [row] = (await pools.run(statement, { source: pools.main })).rows as Array<{ expired: number }>;
  return row?.expired ?? 0;
}
