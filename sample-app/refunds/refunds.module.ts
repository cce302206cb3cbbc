import { Module, type DynamicModule } from '@nestjs/common';
import { RefundRequestsConsumer } from './refund-requests.consumer.js';
import { RefundsResolver } from './refunds.resolver.js';
import { RefundsService } from './refunds.service.js';

/** Refunds: requested through GraphQL (`requestRefund`) and, with a broker, consumed from RabbitMQ or NATS JetStream. */
@Module({})
export class RefundsModule {
  /**
   * `consumeMessages`: whether the app consumes refund requests from a broker. Only then is the consumer
   * registered: Nest maps every controller as HTTP routes too, and logs one with only message patterns as an empty
   * `RefundRequestsConsumer {/}` line.
   */
  static register(options: { consumeMessages: boolean }): DynamicModule {
    return {
      module: RefundsModule,
      controllers: options.consumeMessages ? [RefundRequestsConsumer] : [],
      providers: [RefundsService, RefundsResolver],
    };
  }
}
