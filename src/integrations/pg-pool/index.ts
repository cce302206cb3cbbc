/**
 * `nest-idempotency-pg/pg-pool`: a `pg.Pool` whose statements inside an
 * idempotent execution run in its transaction, for ORMs that run on the app's
 * own pool (Prisma with `@prisma/adapter-pg` first). It imports nothing of
 * them; `pg` is a peer of the package anyway.
 */
export { idempotentPool, IdempotentPool } from './idempotent-pool.js';
