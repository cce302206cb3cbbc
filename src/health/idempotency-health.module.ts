import { Module } from '@nestjs/common';
import { IdempotencyHealthIndicator } from './idempotency-health.indicator.js';

/**
 * Provides `IdempotencyHealthIndicator`, for a health controller beside
 * Terminus's own indicators: `imports: [TerminusModule, IdempotencyHealthModule]`.
 *
 * The indicator reads the store, the sweeper and the outbox of
 * `IdempotencyModule`, which is global by default. With `isGlobal: false`,
 * list `IdempotencyHealthIndicator` in the providers of a module that imports
 * `IdempotencyModule` instead.
 */
@Module({
  providers: [IdempotencyHealthIndicator],
  exports: [IdempotencyHealthIndicator],
})
export class IdempotencyHealthModule {}
