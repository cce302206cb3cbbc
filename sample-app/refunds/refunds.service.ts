import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import { TransactionHost } from '../../src/index.js';
import { EffectLedger } from '../../src/ledger/index.js';

export interface RefundRequest {
  /** The requester's id for this refund; one refund per id, for ever. */
  refundId: string;
  chargeId: string;
  amount: number;
}

export interface Refund {
  id: string;
  object: 'refund';
  refundId: string;
  chargeId: string;
  amount: number;
  /** `refunded` the first time; `already-refunded` when the ledger says an earlier request did it. */
  status: 'refunded' | 'already-refunded';
  source: 'message' | 'graphql';
  created: string;
}

/** Why a refund cannot be made: a definite answer, stored and replayed like a 4xx. */
export class RefundRefused extends Error {
  constructor(
    readonly code: 'charge_not_found' | 'amount_exceeds_charge',
    message: string,
  ) {
    super(message);
    this.name = 'RefundRefused';
  }
}

interface RefundRow {
  id: string;
  refund_id: string;
  charge_id: string;
  amount: number;
  source: 'message' | 'graphql';
  created: Date;
}

/**
 * Refunds a charge in the idempotent execution's transaction (the message's
 * or the mutation's). The idempotency key stops retries for its TTL; the
 * effect ledger stops every later one, however late: a request replayed from
 * a dead-letter queue a week on finds `refund:<refundId>` and refunds nothing.
 */
@Injectable()
export class RefundsService {
  constructor(
    private readonly tx: TransactionHost,
    private readonly ledger: EffectLedger,
  ) {}

  async refund(tenant: string, request: RefundRequest, source: Refund['source']): Promise<Refund> {
    const manager = this.tx.manager;
    if (!(await this.ledger.once(`refund:${request.refundId}`, { scope: 'refunds' }))) {
      const [earlier] = (await manager.query('SELECT * FROM refunds WHERE tenant_id = $1 AND refund_id = $2', [
        tenant,
        request.refundId,
      ])) as RefundRow[];
      return { ...view(earlier), status: 'already-refunded' };
    }
    const [charge] = (await manager.query('SELECT amount FROM charges WHERE tenant_id = $1 AND id = $2', [
      tenant,
      request.chargeId,
    ])) as Array<{ amount: number }>;
    if (!charge) throw new RefundRefused('charge_not_found', `No charge ${request.chargeId} for this account.`);
    if (request.amount > charge.amount) {
      throw new RefundRefused('amount_exceeds_charge', `The refund is larger than the charge (${charge.amount}).`);
    }
    const [row] = (await manager.query(
      `INSERT INTO refunds (id, tenant_id, refund_id, charge_id, amount, source) VALUES ($1, $2, $3, $4, $5, $6) RETURNING *`,
      [`re_${randomBytes(12).toString('hex')}`, tenant, request.refundId, request.chargeId, request.amount, source],
    )) as RefundRow[];
    return { ...view(row), status: 'refunded' };
  }
}

/** A charge's refunds, in the caller's tenant. */
export async function refundsOfCharge(tx: TransactionHost, tenant: string, chargeId: string): Promise<Refund[]> {
  const rows = (await tx.manager.query('SELECT * FROM refunds WHERE tenant_id = $1 AND charge_id = $2 ORDER BY created, id', [
    tenant,
    chargeId,
  ])) as RefundRow[];
  return rows.map((row) => ({ ...view(row), status: 'refunded' }));
}

function view(row: RefundRow): Omit<Refund, 'status'> {
  return {
    id: row.id,
    object: 'refund',
    refundId: row.refund_id,
    chargeId: row.charge_id,
    amount: Number(row.amount),
    source: row.source,
    created: new Date(row.created).toISOString(),
  };
}
