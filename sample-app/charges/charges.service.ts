import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import { TransactionHost } from '../../src/index.js';
import { SimulatedCardProcessor } from './card-processor.js';
import { ChargeEntity } from './charge.entity.js';
import { toChargeView, type ChargeListView, type ChargeView } from './charge.view.js';
import type { CreateChargeDto } from './create-charge.dto.js';

export function newChargeId(): string {
  return `ch_${randomBytes(12).toString('hex')}`;
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
  async create(tenantId: string, input: CreateChargeDto): Promise<ChargeView> {
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
    });
    // insert() rather than save(): the id is new, so save()'s existence check would be a wasted round trip.
    await charges.insert(charge);
    await this.processor.capture(input.simulate);
    return toChargeView(charge);
  }

  async list(tenantId: string, limit: number): Promise<ChargeListView> {
    const [charges, count] = await this.transactions.manager.getRepository(ChargeEntity).findAndCount({
      where: { tenantId },
      order: { created: 'DESC', id: 'DESC' },
      take: limit,
    });
    return { object: 'list', data: charges.map(toChargeView), count };
  }

  async get(tenantId: string, id: string): Promise<ChargeView | undefined> {
    const charge = await this.transactions.manager.getRepository(ChargeEntity).findOneBy({ tenantId, id });
    return charge ? toChargeView(charge) : undefined;
  }
}
