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

export function newOrderId(): string {
  return `ord_${randomBytes(12).toString('hex')}`;
}
