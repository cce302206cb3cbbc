import type { SourceDataSource } from '../connection.js';

/** Options of `PostgresIdempotencyStore`. */
export interface PostgresIdempotencyStoreOptions {
  /**
   * Run the claim and the completion as named prepared statements. Their
   * plans are cached per connection by the functions they call anyway; this
   * also saves the parse of the short call. Only on direct connections, or
   * PgBouncer 1.21+ with `max_prepared_statements`. Default false.
   */
  preparedStatements?: boolean;
  /**
   * Where claims, replays, 409/422 answers, releases and lease renewals run:
   * a data source with a small pool of its own, so they never queue behind
   * business transactions holding the main pool. Default: the main data source.
   */
  claimDataSource?: SourceDataSource;
  /**
   * The key table is the partitioned one (`createPartitionedIdempotencyKeysMigration`):
   * `sweep` then keeps partitions made ahead and retires whole partitions
   * instead of deleting rows. The claim and completion calls are the same
   * (the table's functions differ). Default false.
   */
  partitioned?: boolean;
  /** The key table is distributed on Citus by `distributeIdempotencyTables` (see the module option `citus`). Default false. */
  citus?: boolean;
}
