import type { DataSource } from 'typeorm';

/**
 * Runs pending migrations with at most one process doing so per schema.
 *
 * TypeORM creates its `migrations` table and reads which migrations ran
 * outside any lock, so instances starting together against an empty database
 * race (duplicate-table errors, or one migration applied twice). A
 * transaction-level advisory lock, taken in a transaction of its own that
 * stays open on a dedicated connection for the whole run, serialises them;
 * the later instances then find nothing pending. Being transaction-level, the
 * lock also works behind PgBouncer in transaction pooling (the open
 * transaction pins one server connection) and never outlives the run, even if
 * the process dies.
 */
export async function runMigrationsSerialised(dataSource: DataSource, schema: string | undefined): Promise<string[]> {
  const lockName = `nest-idempotency-sample:migrations:${schema ?? 'default'}`;
  const lockHolder = dataSource.createQueryRunner();
  try {
    await lockHolder.startTransaction();
    await lockHolder.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [lockName]);
    const applied = await dataSource.runMigrations({ transaction: 'each' });
    return applied.map((migration) => migration.name);
  } finally {
    // Ending the lock's transaction releases the lock.
    if (lockHolder.isTransactionActive) await lockHolder.rollbackTransaction().catch(() => undefined);
    await lockHolder.release();
  }
}
