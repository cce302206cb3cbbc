/**
 * The public API: what an application imports. Everything else under src/ is
 * internal and may change without notice.
 *
 * This root entry is the core, and needs only the required peers. Integrations
 * tied to an optional peer have subpaths of their own, so an app that does not
 * use them loads none of their code: `nest-idempotency-pg/health` (Terminus),
 * `/openapi` (Swagger), `/graphql` (the GraphQL errors), `/outbound` (derived
 * keys on fetch and axios calls), `/jetstream` (NATS JetStream),
 * `/cls-transactional` and `/typeorm-transactional` (the app's own transaction
 * manager joins the handler's transaction), and `/client` (the retrying
 * client, without Nest, and the key derivation: `deriveKey`, `businessKey`).
 * Parts an app may not use have theirs too, though the module provides them:
 * `/outbox` (the transactional outbox and its relay), `/ledger` (the effect
 * ledger) and `/store` (the store contract, for a store of your own).
 */
export { IdempotencyModule } from './idempotency.module.js';
export type { IdempotencyModuleExtras } from './idempotency.module-definition.js';
export { Idempotent, SkipIdempotency } from './idempotent.decorator.js';
export { IdempotencyService, type ExecuteInput } from './idempotency.service.js';
export type {
  Duration,
  FailurePolicy,
  FingerprintFunction,
  IdempotencyModuleOptions,
  IdempotencyRouteOptions,
  KeyExtractor,
  SweepSchedule,
  TenantResolver,
} from './idempotency.options.js';
export { PostgresIdempotencyStore } from './store/postgres/postgres-idempotency.store.js';
export type { PostgresIdempotencyStoreOptions } from './store/postgres/postgres-store-options.js';
export { createIdempotencyKeysMigration, CreateIdempotencyKeys1764460800000 } from './store/idempotency-keys.migration.js';
export {
  createPartitionedIdempotencyKeysMigration,
  CreatePartitionedIdempotencyKeys1765152000000,
  type PartitionedKeysMigrationOptions,
} from './store/partitioned/partitioned-keys.migration.js';
export {
  createDistributeIdempotencyTablesMigration,
  distributeIdempotencyTables,
  type CitusLayout,
} from './store/citus/distribute.js';
export { migratingDataSourceFactory, runMigrationsWithLock, type RunMigrationsOptions } from './store/run-migrations.js';
export { createIdempotencyKeyEntity, IdempotencyKeyEntity } from './store/idempotency-key.entity.js';
export { migrateIdempotencyTables, MODULE_MIGRATIONS_TABLE, type IdempotencyTablesOptions } from './store/module-migrations.js';
export type { SourceDataSource, SourceManager, SourceQueryRunner, StatementLogger } from './store/connection.js';
export { IdempotencySweeper, type SweepReport } from './sweeper/idempotency.sweeper.js';
export { TransactionHost } from './transaction/transaction-host.js';
export type { AppTransactionManager, TransactionOutcome } from './transaction/app-transaction-manager.js';
export { TxManager } from './transaction/tx-manager.decorator.js';
export { Phased } from './transaction/phased.decorator.js';
export { DownstreamKeys } from './transaction/downstream-keys.js';
export { Phases } from './core/phases.js';
export {
  FingerprintMismatchError,
  IdempotencyError,
  IdempotencyInputError,
  KeyInFlightError,
  LeaseLostError,
  StoreUnavailableError,
} from './core/errors.js';
export { IdempotencyConfigurationError } from './errors/configuration.error.js';
export { IdempotencyProblemException, ProblemType, PROBLEM_CONTENT_TYPE, type ProblemDetails } from './errors/problems.js';
export {
  IdempotencyEvents,
  type IdempotencyEvent,
  type IdempotencyEventListener,
  type IdempotencyOutcome,
} from './telemetry/events.js';
