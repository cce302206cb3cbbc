/**
 * `nest-idempotency-pg/cls-transactional`: `@nestjs-cls/transactional`'s
 * `@Transactional()` methods join an idempotent handler's transaction. Its
 * packages (`nestjs-cls`, `@nestjs-cls/transactional`) are optional peers,
 * loaded at start-up only when `clsTransactional()` is the module's
 * `transactionManager`.
 */
export { clsTransactional, type ClsTransactionalOptions } from './cls-transactional.js';
