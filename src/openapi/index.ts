/**
 * `nest-idempotency-pg/openapi`: idempotent routes in an OpenAPI document made by
 * `@nestjs/swagger`, an optional peer loaded only when it is installed.
 */
export { IdempotencyOpenApiModule } from './idempotency-openapi.module.js';
export { applyIdempotencyToOpenApi, IDEMPOTENCY_PROBLEM_SCHEMA, type OpenApiDocumentLike } from './apply-idempotency.js';
export type { IdempotencyOperationMark } from './openapi-marks.js';
