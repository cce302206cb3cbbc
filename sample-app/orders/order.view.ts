import { randomBytes } from 'node:crypto';

export interface OrderView {
  id: string;
  object: 'order';
  amount: number;
  currency: string;
  customer: string;
  status: 'pending' | 'paid';
  paymentId: string | null;
  /** Receipt emails the outbox relay delivered for this order (at least once: it may be more than one). */
  receiptsDelivered: number;
  created: string;
}

const ORDER_ID = /^ord_[0-9a-f]{24}$/;

export function newOrderId(): string {
  return `ord_${randomBytes(12).toString('hex')}`;
}

/** Whether `id` has the form `newOrderId()` gives; anything else names no order. */
export function isOrderId(id: string): boolean {
  return ORDER_ID.test(id);
}
