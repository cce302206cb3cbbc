import type { DataSource } from 'typeorm';

/**
 * Runs pending migrations with at most one process doing so per schema.
 *
 * TypeORM creates its `migrations` table and reads which migrations ran
 * outside any lock, so instances starting together against an empty database
 * race (duplicate-table errors, or one migration applied twice). A session
 * advisory lock held on a dedicated connection around the whole run
 * serialises them; the later instances then find nothing pending. Session
 * locks are fine here because the app talks to PostgreSQL directly; behind a
 * transaction-pooling PgBouncer, run migrations as a separate deploy step.
 */
export async function runMigrationsSerialised(dataSource: DataSource, schema: string | undefined): Promise<string[]> {
  const lockName = `nest-idempotency-sample:migrations:${schema ?? 'default'}`;
  const lockHolder = dataSource.createQueryRunner();
  await lockHolder.connect();
  try {
    await lockHolder.query('SELECT pg_advisory_lock(hashtextextended($1, 0))', [lockName]);
    try {
      const applied = await dataSource.runMigrations({ transaction: 'each' });
      return applied.map((migration) => migration.name);
    } finally {
      // Unlock before the connection goes back to the pool, or the lock would outlive the run.
      await lockHolder.query('SELECT pg_advisory_unlock(hashtextextended($1, 0))', [lockName]);
    }
  } finally {
    await lockHolder.release();
  }
}
