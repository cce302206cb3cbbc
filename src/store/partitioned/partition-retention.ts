import type { SourceDataSource } from '../connection.js';
import type { SweepOptions, SweepResult } from '../../core/idempotency-store.js';
import { deleteInPacedBatches } from '../paced-batches.js';
import { partitionedRetentionStatements } from './partitioned-key-table.sql.js';

/** SQLSTATE of a lock wait that ran past `lock_timeout`. */
const LOCK_NOT_AVAILABLE = '55P03';

/**
 * How long retirement and upkeep wait for a lock. While a DROP waits for its
 * ACCESS EXCLUSIVE lock, claims queue behind it, so the wait is short; a
 * retirement that does not get the lock is tried again on the next run.
 */
export const PARTITION_LOCK_TIMEOUT_MS = 100;

/** What `<table>_partition_status()` reports (see `partitionStatusFunction`). */
export interface PartitionStatus {
  /** Partitions attached, not counting the default one. */
  partitions: number;
  /** Whether a partition covers now; if not, new keys go to the default partition. */
  coversNow: boolean;
  /** How far past now the newest partition reaches (negative: none covers now); null without partitions. */
  aheadMs: number | null;
  /** The newest partition's width. */
  intervalMs: number | null;
  /** Partitions whose range is over and which hold nothing live, still attached. */
  retirable: number;
  defaultPartition: string | null;
  /** Rows in the default partition, counted up to the limit asked for. */
  defaultRows: number;
}

/**
 * Retention of the partitioned key table, run by the store's `sweep` under
 * its sweep lock (one process at a time): keep partitions made ahead, drop
 * the partitions that can go (see `<table>_retire_partition`), and delete the
 * expired rows of the default partition in batches, as the plain table's
 * sweeper deletes everything. No row of a regular partition is ever deleted.
 */
export class PartitionRetention {
  private readonly sql: ReturnType<typeof partitionedRetentionStatements>;

  /** @param table the key table, quoted */
  constructor(
    private readonly dataSource: SourceDataSource,
    table: string,
  ) {
    this.sql = partitionedRetentionStatements(table);
  }

  async run(options: SweepOptions): Promise<SweepResult> {
    const started = Date.now();
    const partitions = { made: 0, retired: 0, retiredKeys: 0, postponed: false };
    const made = await this.untilLocked(() => this.query<{ made: number }>(this.sql.makePartitions, [PARTITION_LOCK_TIMEOUT_MS]));
    if (made) partitions.made = made[0]?.made ?? 0;
    else partitions.postponed = true;
    while (Date.now() - started < options.maxDurationMs) {
      const rows = await this.untilLocked(() =>
        this.query<{ retired: string; estimated_rows: string }>(this.sql.retirePartition, [PARTITION_LOCK_TIMEOUT_MS]),
      );
      if (!rows) partitions.postponed = true;
      if (!rows?.length) break;
      partitions.retired++;
      partitions.retiredKeys += Number(rows[0].estimated_rows);
    }
    const swept = await this.sweepDefault(options, started);
    return { ran: true, ...swept, durationMs: Date.now() - started, partitions };
  }

  /** Expired rows waiting in the default partition, at most `limit` (the rest are retired with their partitions). */
  async countExpired(limit: number): Promise<number> {
    const defaultPartition = await this.defaultPartition();
    if (!defaultPartition) return 0;
    const [row] = await this.query<{ expired: number }>(this.sql.countExpiredDefault(defaultPartition), [limit]);
    return row?.expired ?? 0;
  }

  async status(defaultRowsLimit: number): Promise<PartitionStatus> {
    const [row] = await this.query<{
      partitions: number;
      covers_now: boolean;
      ahead_ms: number | null;
      interval_ms: number | null;
      retirable: number;
      default_partition: string | null;
      default_rows: number;
    }>(this.sql.status, [defaultRowsLimit]);
    return {
      partitions: row.partitions,
      coversNow: row.covers_now,
      aheadMs: row.ahead_ms === null ? null : Math.round(row.ahead_ms),
      intervalMs: row.interval_ms === null ? null : Math.round(row.interval_ms),
      retirable: row.retirable,
      defaultPartition: row.default_partition,
      defaultRows: row.default_rows,
    };
  }

  /** The default partition's expired rows, in batches paced like the plain sweeper's. */
  private async sweepDefault(options: SweepOptions, started: number) {
    const defaultPartition = await this.defaultPartition();
    if (!defaultPartition) return { deleted: 0, batches: 0, restedMs: 0 };
    const sweep = this.sql.sweepDefault(defaultPartition);
    return deleteInPacedBatches(
      async () => {
        const runner = this.dataSource.createQueryRunner();
        try {
          return ((await runner.query(sweep, [options.batchSize], true)) as { affected?: number }).affected ?? 0;
        } finally {
          await runner.release();
        }
      },
      options,
      started,
    );
  }

  private async defaultPartition(): Promise<string | undefined> {
    const [row] = await this.query<{ name: string }>(this.sql.defaultPartition, []);
    return row?.name;
  }

  /** The statement's rows, or undefined when it gave up waiting for a lock. */
  private async untilLocked<T>(statement: () => Promise<T>): Promise<T | undefined> {
    try {
      return await statement();
    } catch (error) {
      const code =
        (error as { code?: unknown; driverError?: { code?: unknown } }).driverError?.code ?? (error as { code?: unknown }).code;
      if (code === LOCK_NOT_AVAILABLE) return undefined;
      throw error;
    }
  }

  private async query<T>(sql: string, params: unknown[]): Promise<T[]> {
    return (await this.dataSource.query(sql, params)) as T[];
  }
}
