import { Body, Controller, Get, Headers, NotFoundException, Param, Post } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { Idempotent, Phased, TransactionHost, type Phases } from '../../src/index.js';
import { Outbox } from '../../src/outbox/index.js';
import { CurrentTenant } from '../auth/tenant.decorator.js';
import { crashIfRequested } from '../faults/crash-point.js';
import { PaymentProviderClient } from '../provider/payment-provider.client.js';
import { CheckoutDto } from './checkout.dto.js';
import { isOrderId, newOrderId, type OrderView } from './order.view.js';

/**
 * A checkout that spans systems, written as atomic phases:
 * 1. `create-order`: the order row, committed with the key's recovery point;
 * 2. `charge`: the payment provider, called with a key derived from the
 *    request's, so a retry can never charge twice; its payment is recorded;
 * 3. `confirm`: the order marked paid and the receipt written to the outbox,
 *    in one transaction, so the email goes out if and only if the order is paid.
 * A retry that takes the key over (after a crash, once the lease ends) resumes
 * after the last recorded phase.
 */
@Controller('orders')
export class OrdersController {
  constructor(
    private readonly provider: PaymentProviderClient,
    private readonly outbox: Outbox,
    private readonly transactions: TransactionHost,
  ) {}

  @Post('checkout')
  @Idempotent({ phases: true })
  async checkout(
    @CurrentTenant() tenant: string,
    @Body() input: CheckoutDto,
    @Phased() phases: Phases<EntityManager>,
    @Headers() headers: Record<string, string | undefined>,
  ): Promise<OrderView> {
    const orderId = await phases.run('create-order', async (tx) => {
      const id = newOrderId();
      await tx.query(
        `INSERT INTO orders (id, tenant_id, amount, currency, customer, email, status) VALUES ($1, $2, $3, $4, $5, $6, 'pending')`,
        [id, tenant, input.amount, input.currency, input.customer, input.email],
      );
      return id;
    });
    crashIfRequested(headers, 'create-order');

    const payment = await phases.run('charge', () =>
      this.provider.charge(tenant, input.amount, input.currency, phases.key('charge', { maxLength: 64 })),
    );
    crashIfRequested(headers, 'charge');

    await phases.run('confirm', async (tx) => {
      await tx.query(`UPDATE orders SET status = 'paid', payment_id = $2 WHERE id = $1`, [orderId, payment.id]);
      await this.outbox.enqueue('receipt.email', { orderId, email: input.email, amount: input.amount }, { manager: tx });
    });
    crashIfRequested(headers, 'confirm');

    return (await this.find(tenant, orderId))!;
  }

  @Get(':id')
  async get(@CurrentTenant() tenant: string, @Param('id') id: string): Promise<OrderView> {
    // An id that cannot exist (a NUL, which PostgreSQL's text refuses with an error) is as absent as any other.
    const order = isOrderId(id) ? await this.find(tenant, id) : undefined;
    if (!order) throw new NotFoundException('No such order.');
    return order;
  }

  private async find(tenant: string, id: string): Promise<OrderView | undefined> {
    const [row] = (await this.transactions.manager.query(
      `SELECT o.id, o.amount, o.currency, o.customer, o.status, o.payment_id, o.created,
              (SELECT count(*)::int FROM receipt_deliveries r WHERE r.order_id = o.id) AS receipts_delivered
         FROM orders o WHERE o.tenant_id = $1 AND o.id = $2`,
      [tenant, id],
    )) as Array<Record<string, unknown>>;
    if (!row) return undefined;
    return {
      id: row.id as string,
      object: 'order',
      amount: row.amount as number,
      currency: row.currency as string,
      customer: row.customer as string,
      status: row.status as 'pending' | 'paid',
      paymentId: (row.payment_id as string | null) ?? null,
      receiptsDelivered: row.receipts_delivered as number,
      created: (row.created as Date).toISOString(),
    };
  }
}
