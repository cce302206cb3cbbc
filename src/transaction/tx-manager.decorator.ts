import { createParamDecorator } from '@nestjs/common';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { idempotencyContext } from './idempotency-context.js';

/**
 * Injects the `EntityManager` of the request's idempotency transaction into a
 * handler parameter: `create(@Body() dto: X, @TxManager() manager: EntityManager)`.
 * On an `@Idempotent()` route that runs without a key (`required: false`) it
 * is the data source's plain manager. Elsewhere, inject `TransactionHost`.
 */
export const TxManager = createParamDecorator((_data: unknown) => {
  const store = idempotencyContext.getStore();
  if (!store) {
    throw new IdempotencyConfigurationError(
      '@TxManager() is only available on @Idempotent() routes. Elsewhere, inject TransactionHost and use its `manager`.',
    );
  }
  return store.manager;
});
