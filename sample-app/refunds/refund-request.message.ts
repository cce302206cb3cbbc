import { IsIn, IsInt, IsObject, IsOptional, IsString, Length, Max, Min } from 'class-validator';

/** The routing pattern of refund requests on the queue. */
export const REFUND_REQUESTED = 'refund.requested';

/**
 * Test-only behaviour for the reliability suite, honoured only with
 * `SAMPLE_FAULT_INJECTION=1` (a crash) or always (a slow or failing refund
 * processor, as the charges' `simulate` does).
 */
export class RefundSimulation {
  @IsOptional() @IsInt() @Min(0) @Max(60_000) delayMs?: number;
  /** Every delivery fails: a poison message, dead-lettered after maxDeliveries. */
  @IsOptional() @IsIn([true]) fail?: true;
  /** SIGKILL on the first delivery: after the refund's insert, before the commit; or after the commit, before the ack. */
  @IsOptional() @IsIn(['before-commit', 'after-commit']) crash?: 'before-commit' | 'after-commit';
}

/**
 * A `refund.requested` event, published with its idempotency key as the
 * AMQP `messageId`. `tenant` is the merchant account: messages are
 * authenticated by the broker (the publisher's credentials), not by an API key.
 */
export class RefundRequestMessage {
  @IsString() @Length(1, 100) tenant!: string;
  @IsString() @Length(1, 100) refundId!: string;
  @IsString() @Length(1, 100) chargeId!: string;
  @IsInt() @Min(1) @Max(100_000_000) amount!: number;
  @IsOptional() @IsObject() simulate?: RefundSimulation;
}
