import { Module } from '@nestjs/common';
import { RefundRequestsConsumer } from './refund-requests.consumer.js';
import { RefundsResolver } from './refunds.resolver.js';
import { RefundsService } from './refunds.service.js';

/** Refunds: consumed from RabbitMQ (`refund.requested`) and requested through GraphQL (`requestRefund`). */
@Module({
  controllers: [RefundRequestsConsumer],
  providers: [RefundsService, RefundsResolver],
})
export class RefundsModule {}
