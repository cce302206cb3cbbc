import type { EntityManager } from 'typeorm';
import type { SourceManager } from './connection.js';

/**
 * The work's transaction handle as the module's API types it: TypeORM's
 * `EntityManager`, what a TypeORM app is handed. On a plain pg pool it is a
 * `SourceManager` (`query` and `queryRunner`, which the Drizzle and pg-pool
 * integrations use) and has nothing of TypeORM's repositories: such an app
 * writes through its ORM's integration (docs/transactions.md).
 */
export function asWorkManager(manager: SourceManager): EntityManager {
  return manager as EntityManager;
}
