import { Exclude } from 'class-transformer';
import type { ChargeEntity } from './charge.entity.js';
import type { JsonObject } from './json.js';

/**
 * A charge as the API shows it: a class instance, as Nest apps usually
 * return, so the global `ClassSerializerInterceptor` can drop what is
 * internal. The constructor copies only the public fields and `riskScore`,
 * so the owning tenant never reaches a response.
 */
export class Charge {
  readonly id: string;
  readonly object = 'charge' as const;
  readonly amount: number;
  readonly currency: string;
  readonly customer: string;
  readonly description: string | null;
  readonly metadata: JsonObject;
  readonly status: 'succeeded';
  /** ISO 8601, UTC. */
  readonly created: string;

  /** The fraud screen's score, for internal use: kept in the database, never shown (nor stored as a response). */
  @Exclude()
  readonly riskScore: number | null;

  constructor(entity: ChargeEntity) {
    this.id = entity.id;
    this.amount = entity.amount;
    this.currency = entity.currency;
    this.customer = entity.customer;
    this.description = entity.description;
    this.metadata = entity.metadata;
    this.status = entity.status;
    this.created = entity.created.toISOString();
    this.riskScore = entity.riskScore;
  }
}

export interface ChargeList {
  object: 'list';
  data: Charge[];
  /** All of the tenant's charges, not only those in `data`. */
  count: number;
}
