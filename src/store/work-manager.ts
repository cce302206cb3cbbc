import type { EntityManager } from 'typeorm';
import type { SourceManager } from './connection.js';

/**
 * The work's transaction handle as the module's API types it: TypeORM's `EntityManager`. On a plain pg pool it is a
 * `SourceManager`, without TypeORM's repositories (docs/transactions.md).
 */
export function asWorkManager(manager: SourceManager): EntityManager {
  return manager as EntityManager;
}
