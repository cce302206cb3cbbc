import { Injectable } from '@nestjs/common';
import type { Payout } from './generated/prisma/client.js';
import { PrismaService } from './prisma.service.js';

export interface PayoutRequest {
  account: string;
  amount: number;
}

@Injectable()
export class PayoutsService {
  constructor(private readonly prisma: PrismaService) {}

  /** The payout and its ledger entry: in an idempotent request, both commit with the key's stored answer, or neither does. */
  async pay(request: PayoutRequest): Promise<Payout> {
    const payout = await this.prisma.payout.create({ data: { account: request.account, amount: request.amount } });
    // In the key's transaction this is a savepoint: undone alone if it throws, otherwise committed with the key.
    await this.prisma.$transaction(async (tx) => {
      await tx.ledgerEntry.create({ data: { account: request.account, amount: -request.amount } });
    });
    return payout;
  }
}
