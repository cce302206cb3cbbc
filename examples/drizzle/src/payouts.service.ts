import { Injectable } from '@nestjs/common';
import { DrizzleTransactionHost } from 'nest-idempotency-pg/drizzle';
import { ledgerEntries, payouts, type schema } from './schema.js';

export interface PayoutRequest {
  account: string;
  amount: number;
}

@Injectable()
export class PayoutsService {
  constructor(private readonly drizzle: DrizzleTransactionHost<typeof schema>) {}

  /** The payout and its ledger entry: in an idempotent request, both commit with the key's stored answer, or neither does. */
  async pay(request: PayoutRequest) {
    // Read `db` where the statement runs: in an @Idempotent() handler it is the key's transaction.
    const [payout] = await this.drizzle.db
      .insert(payouts)
      .values({ account: request.account, amount: request.amount })
      .returning();
    // A savepoint in the key's transaction, not a transaction of its own.
    await this.drizzle.db.transaction(async (tx) => {
      await tx.insert(ledgerEntries).values({ account: request.account, amount: -request.amount });
    });
    return payout;
  }
}
