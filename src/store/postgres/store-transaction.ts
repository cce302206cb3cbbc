import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../connection.js';
import { asWorkManager } from '../work-manager.js';
import { isUnavailableError } from './unavailable.js';

/**
 * Like `DataSource.transaction`, except for what a failed ROLLBACK means.
 * TypeORM swallows it; here, when the work failed and the ROLLBACK cannot
 * reach the server, it is the ROLLBACK's error that is thrown: the
 * transaction's own connection died, which is the store's failure (a 503,
 * outcome unknown), not the work's, whatever the work then threw.
 */
export async function storeTransaction<T>(main: SourceDataSource, work: (tx: EntityManager) => Promise<T>): Promise<T> {
  const runner = main.createQueryRunner();
  try {
    await runner.startTransaction();
    const result = await work(asWorkManager(runner.manager));
    await runner.commitTransaction();
    return result;
  } catch (error) {
    if (runner.isTransactionActive || runner.isReleased) {
      try {
        await runner.rollbackTransaction();
      } catch (rollbackError) {
        if (isUnavailableError(rollbackError)) throw rollbackError;
      }
    }
    throw error;
  } finally {
    if (!runner.isReleased) await runner.release();
  }
}
