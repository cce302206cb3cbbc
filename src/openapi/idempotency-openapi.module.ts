import { Module } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { openApiMarksProvider } from './openapi-marks.js';

/**
 * Marks every `@Idempotent()` route for `@nestjs/swagger` while the app is
 * created, so that `applyIdempotencyToOpenApi` finds its operations in the
 * generated document: `imports: [IdempotencyOpenApiModule]` beside
 * `IdempotencyModule.forRoot(...)`. Without `@nestjs/swagger` installed it
 * marks nothing and loads nothing.
 *
 * It reads the route settings `IdempotencyModule` resolves, so it needs that
 * module global (the default).
 */
@Module({
  // DiscoveryModule: the pass over every controller's routes.
  imports: [DiscoveryModule],
  providers: [openApiMarksProvider],
})
export class IdempotencyOpenApiModule {}
