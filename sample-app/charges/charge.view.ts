import type { ChargeEntity } from './charge.entity.js';
import type { JsonObject } from './json.js';

/** A charge as the API shows it. */
export interface ChargeView {
  id: string;
  object: 'charge';
  amount: number;
  currency: string;
  customer: string;
  description: string | null;
  metadata: JsonObject;
  status: 'succeeded';
  /** ISO 8601, UTC. */
  created: string;
}

export interface ChargeListView {
  object: 'list';
  data: ChargeView[];
  /** All of the tenant's charges, not only those in `data`. */
  count: number;
}

/** Spells out the public fields so internal columns (`tenant_id`) can never leak into a response. */
export function toChargeView(charge: ChargeEntity): ChargeView {
  return {
    id: charge.id,
    object: 'charge',
    amount: charge.amount,
    currency: charge.currency,
    customer: charge.customer,
    description: charge.description,
    metadata: charge.metadata,
    status: charge.status,
    created: charge.created.toISOString(),
  };
}
