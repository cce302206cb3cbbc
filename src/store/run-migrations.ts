import type { DataSource, DataSourceOptions, Migration } from 'typeorm';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';

export interface RunMigrationsOptions {
  /**
   * How the migrations use transactions. Default: the data source's
   * `migrationsTransactionMode`, else `'all'`.
   * - `'all'`: the lock's own transaction runs every pending migration, on one
   *   connection; nothing is applied unless everything is.
   * - `'each'` / `'none'`: each migration commits on its own, or runs without a
   *   transaction (for a migration that cannot run inside one, such as
   *   `CREATE INDEX CONCURRENTLY`). The lock is then held by a transaction on a
   *   second connection for the whole run, so the pool needs two connections.
   */
  transaction?: 'all' | 'each' | 'none';
}

/**
 * One lock per migrations table: `$1` is the data source's `schema` option (TypeORM
 * puts the migrations table there, or in `current_schema()` when it is unset).
 */
const LOCK_SQL = `SELECT pg_advisory_xact_lock(hashtextextended(
  'nest-idempotency:migrations:' || coalesce($1::text, current_schema(), '') || '.' || $2::text, 0))`;

/**
 * Runs every pending migration of the data source (the app's and the module's)
 * so that instances starting together against one database run each migration
 * exactly once.
 *
 * TypeORM's `migrationsRun: true` creates its `migrations` table and reads which
 * migrations ran without any lock, so two instances can both find a migration
 * pending and both apply it (or fail on a duplicate key). Here a
 * transaction-level advisory lock is taken first, and the migrations table is
 * created and read only once it is held: a later instance waits, then finds
 * nothing pending. Transaction-level because a session lock outlives its
 * client behind PgBouncer in transaction pooling; a transaction lock is
 * released when its transaction ends, also when the process dies.
 *
 * @returns the migrations this call applied (empty when another instance did).
 */
export async function runMigrationsWithLock(dataSource: DataSource, options: RunMigrationsOptions = {}): Promise<Migration[]> {
  const mode = options.transaction ?? dataSource.options.migrationsTransactionMode ?? 'all';
  const lockHolder = dataSource.createQueryRunner();
  try {
    await lockHolder.startTransaction();
    const schema = (dataSource.options as { schema?: string }).schema ?? null;
    await lockHolder.query(LOCK_SQL, [schema, dataSource.options.migrationsTableName ?? 'migrations']);
    let applied: Migration[];
    if (mode === 'all') {
      // On the lock's connection, in its transaction: TypeORM then opens no transaction of its own.
      // Loaded here, not at the top: the package's entry point loads without typeorm (the `pool` option).
      const { MigrationExecutor } = await import('typeorm');
      const executor = new MigrationExecutor(dataSource, lockHolder);
      executor.transaction = 'all';
      applied = await executor.executePendingMigrations();
    } else {
      // The migrations commit on their own connection while the lock's transaction stays open.
      applied = await dataSource.runMigrations({ transaction: mode });
    }
    await lockHolder.commitTransaction();
    return applied;
  } catch (error) {
    if (lockHolder.isTransactionActive) await lockHolder.rollbackTransaction().catch(() => undefined);
    throw error;
  } finally {
    await lockHolder.release();
  }
}

/**
 * A `dataSourceFactory` for `TypeOrmModule.forRootAsync` that initialises the
 * data source and then runs its pending migrations with `runMigrationsWithLock`,
 * in place of `migrationsRun: true` (which is switched off here, since it would
 * run them first without the lock):
 *
 * ```ts
 * TypeOrmModule.forRootAsync({
 *   useFactory: () => ({ type: 'postgres', url, migrations: [CreateIdempotencyKeys1764460800000, ...yours] }),
 *   dataSourceFactory: migratingDataSourceFactory(),
 * })
 * ```
 *
 * The app's providers (the module's start-up schema check among them) see the
 * data source only once the migrations have run.
 */
export function migratingDataSourceFactory(
  options: RunMigrationsOptions = {},
): (dataSourceOptions?: DataSourceOptions) => Promise<DataSource> {
  return async (dataSourceOptions) => {
    if (!dataSourceOptions) throw new IdempotencyConfigurationError(messages.config.migrationsNeedOptions);
    const { DataSource } = await import('typeorm');
    const dataSource = await new DataSource({ ...dataSourceOptions, migrationsRun: false }).initialize();
    try {
      await runMigrationsWithLock(dataSource, options);
    } catch (error) {
      // TypeOrmModule retries a failed factory: each attempt must not leave a pool behind.
      await dataSource.destroy().catch(() => undefined);
      throw error;
    }
    return dataSource;
  };
}
