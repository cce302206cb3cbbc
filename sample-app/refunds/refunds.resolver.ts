import { Args, Context, Field, ID, InputType, Int, Mutation, ObjectType, Query, Resolver } from '@nestjs/graphql';
import { IsInt, IsString, Length, Max, Min } from 'class-validator';
import { GraphQLError } from 'graphql';
import { Idempotent, TransactionHost } from '../../src/index.js';
import type { AuthenticatedRequest } from '../auth/authenticated-request.js';
import { RefundRefused, refundsOfCharge, RefundsService, type Refund } from './refunds.service.js';

@ObjectType('Refund')
export class RefundModel {
  @Field(() => ID) id!: string;
  @Field(() => String) refundId!: string;
  @Field(() => String) chargeId!: string;
  @Field(() => Int) amount!: number;
  @Field(() => String, { description: '`refunded`, or `already-refunded` when an earlier request with this refundId did it.' })
  status!: string;
  @Field(() => String) source!: string;
  @Field(() => String) created!: string;
}

@InputType()
export class RequestRefundInput {
  @Field(() => String) @IsString() @Length(1, 100) refundId!: string;
  @Field(() => String) @IsString() @Length(1, 100) chargeId!: string;
  @Field(() => Int) @IsInt() @Min(1) @Max(100_000_000) amount!: number;
}

/**
 * The GraphQL face of refunds (`POST /graphql`): `requestRefund` is
 * idempotent with the request's `Idempotency-Key` header, like `POST
 * /charges`, and shares the effect ledger with the RabbitMQ consumer, so a
 * refund id is refunded once whichever way it arrives.
 */
@Resolver(() => RefundModel)
export class RefundsResolver {
  constructor(
    private readonly refunds: RefundsService,
    private readonly tx: TransactionHost,
  ) {}

  @Query(() => [RefundModel], { description: "The caller's refunds of a charge." })
  refundsOfCharge(
    @Args('chargeId', { type: () => String }) chargeId: string,
    @Context('req') req: AuthenticatedRequest,
  ): Promise<Refund[]> {
    return refundsOfCharge(this.tx, req.tenant!, chargeId);
  }

  @Mutation(() => RefundModel)
  @Idempotent()
  async requestRefund(
    @Args('input', { type: () => RequestRefundInput }) input: RequestRefundInput,
    @Context('req') req: AuthenticatedRequest,
  ): Promise<Refund> {
    try {
      return await this.refunds.refund(req.tenant!, input, 'graphql');
    } catch (error) {
      // A GraphQL error with a code is a definite answer: stored with the key and the same on every retry.
      if (error instanceof RefundRefused)
        throw new GraphQLError(error.message, { extensions: { code: error.code.toUpperCase() } });
      throw error;
    }
  }
}
