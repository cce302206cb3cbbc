import { createParamDecorator } from '@nestjs/common';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { idempotencyContext } from './idempotency-context.js';

/**
 * Injects the `Phases` of a phased idempotent route:
 *
 * ```ts
 * @Post() @Idempotent({ phases: true })
 * async checkout(@Body() dto: CheckoutDto, @Phased() phases: Phases<EntityManager>) {
 *   const order = await phases.run('create-order', (tx) => this.orders.create(tx, dto));
 *   const payment = await phases.run('charge', () => this.provider.charge(order, phases.key('charge')));
 *   await phases.run('confirm', (tx) => this.orders.confirm(tx, order.id, payment.id));
 *   return { orderId: order.id };
 * }
 * ```
 */
export const Phased = createParamDecorator((_data: unknown) => {
  const phases = idempotencyContext.getStore()?.phases;
  if (!phases) {
    throw new IdempotencyConfigurationError(
      '@Phased() needs an @Idempotent({ phases: true }) route that was called with an idempotency key.',
    );
  }
  return phases;
});
