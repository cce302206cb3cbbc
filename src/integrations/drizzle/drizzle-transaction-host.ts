import { Inject, Injectable } from '@nestjs/common';
import { idempotencyContext } from '../../transaction/idempotency-context.js';
import type { DrizzleBinding, DrizzleDatabase } from './drizzle-binding.js';

/** DI token of the app database's binding (see `IdempotencyDrizzleModule`). */
export const IDEMPOTENCY_DRIZZLE_BINDING = Symbol('IDEMPOTENCY_DRIZZLE_BINDING');

/**
 * The Drizzle counterpart of `TransactionHost`: `db` is the Drizzle database
 * to write through. Inside an idempotent execution (an `@Idempotent()`
 * handler, `IdempotencyService.execute`, a phase) it is a Drizzle
 * transaction on the module's own transaction, the one that also completes
 * the key: its writes commit or roll back with the key's completion, and its
 * `transaction()` opens a savepoint in it. Outside one it is the app's own
 * database (each statement commits on its own, `transaction()` opens one).
 *
 * Read `db` where the statement runs rather than keeping it: the bound
 * transaction refuses statements once its execution has ended.
 */
@Injectable()
export class DrizzleTransactionHost<TSchema extends Record<string, unknown> = Record<string, never>> {
  constructor(@Inject(IDEMPOTENCY_DRIZZLE_BINDING) private readonly binding: DrizzleBinding<TSchema>) {}

  get db(): DrizzleDatabase<TSchema> {
    return this.binding.current();
  }

  /** True while running inside an idempotent execution's transaction. */
  get isTransactional(): boolean {
    return idempotencyContext.getStore()?.transactional ?? false;
  }
}
