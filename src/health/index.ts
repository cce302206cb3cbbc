/**
 * `nest-idempotency-pg/health`: the Terminus health indicator. `@nestjs/terminus`
 * is an optional peer, loaded only by `isHealthy()`; `report()` works without it.
 */
export { IdempotencyHealthModule } from './idempotency-health.module.js';
export {
  HEALTH_PROBE_TENANT,
  IdempotencyHealthIndicator,
  type IdempotencyHealthOptions,
  type IdempotencyHealthReport,
  type IdempotencyHealthResult,
  type IdempotencyHealthStatus,
  type OutboxHealth,
  type PartitionsHealth,
  type StoreHealth,
  type SweeperHealth,
} from './idempotency-health.indicator.js';
export type { PartitionStatus } from '../store/partitioned/partition-retention.js';
