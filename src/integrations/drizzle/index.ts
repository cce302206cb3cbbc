/**
 * `nest-idempotency-pg/drizzle`: an idempotent handler's Drizzle writes in the
 * module's transaction, the one that completes the key. `drizzle-orm` (and,
 * for `clsTransactionalDrizzle()`, `nestjs-cls` and `@nestjs-cls/transactional`
 * with its Drizzle adapter) are optional peers, loaded at start-up; only
 * Drizzle's types are named here.
 */
export { clsTransactionalDrizzle, type ClsTransactionalDrizzleOptions } from './cls-transactional-drizzle.js';
export type { DrizzleDatabase } from './drizzle-binding.js';
export { DrizzleTransactionHost } from './drizzle-transaction-host.js';
export {
  IdempotencyDrizzleModule,
  type IdempotencyDrizzleAsyncOptions,
  type IdempotencyDrizzleOptions,
} from './idempotency-drizzle.module.js';
