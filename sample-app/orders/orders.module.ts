import { Module, type DynamicModule } from '@nestjs/common';
import {
  PAYMENT_PROVIDER_OPTIONS,
  PaymentProviderClient,
  type PaymentProviderOptions,
} from '../provider/payment-provider.client.js';
import { OrdersController } from './orders.controller.js';
import { ReceiptMailer } from './receipt-mailer.js';

@Module({})
export class OrdersModule {
  static register(options: { paymentProvider: PaymentProviderOptions }): DynamicModule {
    return {
      module: OrdersModule,
      controllers: [OrdersController],
      providers: [{ provide: PAYMENT_PROVIDER_OPTIONS, useValue: options.paymentProvider }, PaymentProviderClient, ReceiptMailer],
    };
  }
}
