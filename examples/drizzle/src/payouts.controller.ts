import { Body, Controller, Post } from '@nestjs/common';
import { Idempotent } from 'nest-idempotency-pg';
import { PayoutsService, type PayoutRequest } from './payouts.service.js';

@Controller('payouts')
export class PayoutsController {
  constructor(private readonly payouts: PayoutsService) {}

  @Post()
  @Idempotent()
  create(@Body() body: PayoutRequest) {
    return this.payouts.pay(body);
  }
}
