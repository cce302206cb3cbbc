/** What every charges route of the bench app takes, and the view it answers. */
export interface ChargeBody {
  amount: number;
  currency: string;
  customer: string;
  description?: string;
  /** A slow provider: the handler waits this long after its insert, inside the transaction. */
  delayMs?: number;
  /** Echoed in the response when given (scenario 11 sends about 1 MiB of it). */
  metadata?: unknown;
}

export function chargeView(id: string, created: Date, body: ChargeBody) {
  return {
    id: `ch_${id}`,
    object: 'charge',
    amount: body.amount,
    currency: body.currency,
    customer: body.customer,
    description: body.description ?? null,
    // Only when sent, so the small requests' responses stay as they were.
    ...(body.metadata === undefined ? {} : { metadata: body.metadata }),
    status: 'succeeded',
    created: created.toISOString(),
  };
}
