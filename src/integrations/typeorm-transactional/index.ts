/**
 * `nest-idempotency-pg/typeorm-transactional`: `typeorm-transactional`'s
 * `@Transactional()` methods join an idempotent handler's transaction. The
 * package is an optional peer, loaded at start-up only when
 * `typeormTransactional()` is the module's `transactionManager`.
 */
export { typeormTransactional, type TypeormTransactionalOptions } from './typeorm-transactional.js';
