import {
  BadRequestException,
  Body,
  Controller,
  Get,
  Headers,
  HttpCode,
  Post,
  ServiceUnavailableException,
  UseGuards,
} from '@nestjs/common';
import { InjectDataSource } from '@nestjs/typeorm';
import { randomBytes } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { Public } from '../auth/public.decorator.js';
import { ProviderCredentialGuard } from './provider-credential.guard.js';

/** The merchant account a request acts for, as a platform tells Stripe with `Stripe-Account`. */
export const PROVIDER_ACCOUNT_HEADER = 'provider-account';
const ACCOUNT = /^[\x21-\x7e]{1,100}$/;

interface ProviderCharge {
  id: string;
  amount: number;
  currency: string;
  idempotency_key: string;
}

/**
 * A fake payment provider, reached over HTTP like a real one, that honours
 * its own idempotency keys the way Stripe does: the same key (within one
 * account) returns the same charge. Its ledger commits on its own (it is
 * another system), which is why the checkout must call it with a derived key
 * rather than rely on a transaction.
 *
 * It stands for another company's API: it takes its own credential (see
 * `ProviderCredentialGuard`; the payments API's keys do not open it), and
 * every call names the merchant account (`Provider-Account`, the tenant),
 * whose charges `GET /provider/stats` counts, so tests can check that a
 * customer was charged once and no tenant sees another's figures.
 */
@Public()
@UseGuards(ProviderCredentialGuard)
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
    @Headers(PROVIDER_ACCOUNT_HEADER) accountHeader: string | undefined,
    @Headers('idempotency-key') key: string | undefined,
    @Body() body: { amount?: unknown; currency?: unknown },
  ): Promise<ProviderCharge> {
    if (this.outage) throw new ServiceUnavailableException('The payment provider is down.');
    const account = accountOf(accountHeader);
    if (!key || key.length > 64) throw new BadRequestException('The provider needs an Idempotency-Key of at most 64 characters.');
    if (!Number.isInteger(body.amount) || typeof body.currency !== 'string')
      throw new BadRequestException('amount and currency are required.');
    await this.dataSource.query(
      `INSERT INTO provider_charges (id, account, idempotency_key, amount, currency) VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (account, idempotency_key) DO NOTHING`,
      [`py_${randomBytes(10).toString('hex')}`, account, key, body.amount, body.currency],
    );
    const [charge] = (await this.dataSource.query(
      'SELECT id, amount, currency, idempotency_key FROM provider_charges WHERE account = $1 AND idempotency_key = $2',
      [account, key],
    )) as ProviderCharge[];
    return charge;
  }

  /** The account's charges only. */
  @Get('stats')
  async stats(
    @Headers(PROVIDER_ACCOUNT_HEADER) accountHeader: string | undefined,
  ): Promise<{ account: string; charges: number }> {
    const account = accountOf(accountHeader);
    const [{ count }] = (await this.dataSource.query('SELECT count(*)::int AS count FROM provider_charges WHERE account = $1', [
      account,
    ])) as Array<{ count: number }>;
    return { account, charges: count };
  }
}

function accountOf(header: string | undefined): string {
  if (header === undefined || !ACCOUNT.test(header)) {
    throw new BadRequestException('Name the merchant account in a Provider-Account header (1 to 100 visible ASCII characters).');
  }
  return header;
}
