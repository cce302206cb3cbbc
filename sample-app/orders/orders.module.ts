import { Module } from '@nestjs/common';
import { FakePaymentProviderController } from '../provider/fake-payment-provider.controller.js';
import { PaymentProviderClient } from '../provider/payment-provider.client.js';
import { OrdersController } from './orders.controller.js';
import { ReceiptMailer } from './receipt-mailer.js';

@Module({
  controllers: [OrdersController, FakePaymentProviderController],
  providers: [PaymentProviderClient, ReceiptMailer],
})
export class OrdersModule {}
