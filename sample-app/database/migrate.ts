import type { DataSource } from 'typeorm';
import { runMigrationsWithLock } from '../../src/index.js';

/**
 * Runs the pending migrations with at most one instance doing so at a time,
 * so several instances can start together against one empty database (see
 * `runMigrationsWithLock`: a transaction-level advisory lock, which also works
 * behind PgBouncer in transaction pooling).
 *
 * @returns the names of the migrations this instance applied
 */
export async function runMigrationsSerialised(dataSource: DataSource): Promise<string[]> {
  const applied = await runMigrationsWithLock(dataSource);
  return applied.map((migration) => migration.name);
}
