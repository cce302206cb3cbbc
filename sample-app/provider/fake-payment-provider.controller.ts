import { BadRequestException, Body, Controller, Get, Headers, HttpCode, Post, ServiceUnavailableException } from '@nestjs/common';
import { InjectDataSource } from '@nestjs/typeorm';
import { randomBytes } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { Public } from '../auth/public.decorator.js';

interface ProviderCharge {
  id: string;
  amount: number;
  currency: string;
  idempotency_key: string;
}

/**
 * A fake payment provider, reached over HTTP like a real one, that honours
 * its own idempotency keys the way Stripe does: the same key returns the same
 * charge. Its ledger commits on its own (it is another system), which is why
 * the checkout must call it with a derived key rather than rely on a
 * transaction. `GET /provider/stats` counts real charges, so tests can check
 * that a customer was charged once.
 */
@Public()
@Controller('provider')
export class FakePaymentProviderController {
  /** While true the provider answers 503, like a real one during an outage. */
  private outage = false;

  constructor(@InjectDataSource() private readonly dataSource: DataSource) {}

  /** Starts or ends a simulated outage (a fake provider's knob for demos and tests). */
  @Post('outage')
  @HttpCode(204)
  setOutage(@Body() body: { on?: unknown }): void {
    this.outage = body.on === true;
  }

  @Post('charges')
  @HttpCode(200)
  async charge(
    @Headers('idempotency-key') key: string | undefined,
    @Body() body: { amount?: unknown; currency?: unknown },
  ): Promise<ProviderCharge> {
    if (this.outage) throw new ServiceUnavailableException('The payment provider is down.');
    if (!key || key.length > 64) throw new BadRequestException('The provider needs an Idempotency-Key of at most 64 characters.');
    if (!Number.isInteger(body.amount) || typeof body.currency !== 'string')
      throw new BadRequestException('amount and currency are required.');
    await this.dataSource.query(
      `INSERT INTO provider_charges (id, idempotency_key, amount, currency) VALUES ($1, $2, $3, $4)
       ON CONFLICT (idempotency_key) DO NOTHING`,
      [`py_${randomBytes(10).toString('hex')}`, key, body.amount, body.currency],
    );
    const [charge] = (await this.dataSource.query(
      'SELECT id, amount, currency, idempotency_key FROM provider_charges WHERE idempotency_key = $1',
      [key],
    )) as ProviderCharge[];
    return charge;
  }

  @Get('stats')
  async stats(): Promise<{ charges: number }> {
    const [{ count }] = (await this.dataSource.query('SELECT count(*)::int AS count FROM provider_charges')) as Array<{
      count: number;
    }>;
    return { charges: count };
  }
}
