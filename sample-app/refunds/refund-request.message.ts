import { Type } from 'class-transformer';
import { IsIn, IsInt, IsObject, IsOptional, IsString, Length, Max, Min, ValidateNested } from 'class-validator';

/** The routing pattern of refund requests on the queue. */
export const REFUND_REQUESTED = 'refund.requested';

/**
 * Where `simulate.crash` kills the consumer (with SAMPLE_FAULT_INJECTION=1):
 * `before-commit` after the refund's insert, before the commit, and
 * `after-commit` after the commit, before the acknowledgement, both on the
 * first delivery only; `every-delivery` before the commit on every delivery,
 * a poison message that only the module's count of its attempts stops.
 */
export const CRASH_POINTS = ['before-commit', 'after-commit', 'every-delivery'] as const;
export type CrashPoint = (typeof CRASH_POINTS)[number];

/**
 * Test-only behaviour for the reliability suite, honoured only with
 * `SAMPLE_FAULT_INJECTION=1` (a crash) or always (a slow or failing refund
 * processor, as the charges' `simulate` does).
 */
export class RefundSimulation {
  @IsOptional() @IsInt() @Min(0) @Max(60_000) delayMs?: number;
  /** Every delivery fails: a poison message, dead-lettered after maxDeliveries. */
  @IsOptional() @IsIn([true]) fail?: true;
  /** SIGKILL of the consumer at that point (see CRASH_POINTS). */
  @IsOptional() @IsIn(CRASH_POINTS) crash?: CrashPoint;
}

/**
 * A `refund.requested` event, published with its idempotency key as the
 * AMQP `messageId` (the `Nats-Msg-Id` header on JetStream). `tenant` is the
 * merchant account: messages are authenticated by the broker (the
 * publisher's credentials), not by an API key.
 */
export class RefundRequestMessage {
  @IsString() @Length(1, 100) tenant!: string;
  @IsString() @Length(1, 100) refundId!: string;
  @IsString() @Length(1, 100) chargeId!: string;
  @IsInt() @Min(1) @Max(100_000_000) amount!: number;
  // Without @ValidateNested and @Type the pipe checks only that it is an object: an unknown crash point, or a field
  // the whitelist would refuse at the top level, would pass.
  @IsOptional() @IsObject() @ValidateNested() @Type(() => RefundSimulation) simulate?: RefundSimulation;
}
