import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import { TransactionHost } from '../../src/index.js';
import { SimulatedCardProcessor } from './card-processor.js';
import { ChargeEntity } from './charge.entity.js';
import { Charge, type ChargeList } from './charge.view.js';
import type { CreateChargeDto } from './create-charge.dto.js';
import { riskScoreFor } from './risk-score.js';

const CHARGE_ID = /^ch_[0-9a-f]{24}$/;

export function newChargeId(): string {
  return `ch_${randomBytes(12).toString('hex')}`;
}

/**
 * Whether `id` has the form `newChargeId()` gives. Anything else names no
 * charge, so it is answered as absent without a query: PostgreSQL would
 * reject some of it (a NUL in `text`) with an error, which is no 404.
 */
export function isChargeId(id: string): boolean {
  return CHARGE_ID.test(id);
}

@Injectable()
export class ChargesService {
  constructor(
    private readonly transactions: TransactionHost,
    private readonly processor: SimulatedCardProcessor,
  ) {}

  /**
   * Writes the charge, then asks the processor. The row is written as
   * `succeeded` up front because it only survives if the processor agrees:
   * on an `@Idempotent()` route `TransactionHost.manager` is the request's
   * transaction, which a decline or an error rolls back.
   */
  async create(tenantId: string, input: CreateChargeDto): Promise<Charge> {
    const charges = this.transactions.manager.getRepository(ChargeEntity);
    const charge = charges.create({
      id: newChargeId(),
      tenantId,
      amount: input.amount,
      currency: input.currency,
      customer: input.customer,
      description: input.description ?? null,
      metadata: input.metadata ?? {},
      status: 'succeeded',
      riskScore: riskScoreFor(input.amount),
    });
    // insert() rather than save(): the id is new, so save()'s existence check would be a wasted round trip.
    await charges.insert(charge);
    await this.processor.capture(input.simulate);
    return new Charge(charge);
  }

  async list(tenantId: string, limit: number): Promise<ChargeList> {
    const [charges, count] = await this.transactions.manager.getRepository(ChargeEntity).findAndCount({
      where: { tenantId },
      order: { created: 'DESC', id: 'DESC' },
      take: limit,
    });
    return { object: 'list', data: charges.map((charge) => new Charge(charge)), count };
  }

  async get(tenantId: string, id: string): Promise<Charge | undefined> {
    if (!isChargeId(id)) return undefined;
    const charge = await this.transactions.manager.getRepository(ChargeEntity).findOneBy({ tenantId, id });
    return charge ? new Charge(charge) : undefined;
  }
}
