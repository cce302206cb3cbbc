import { Inject, Injectable } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { AddressInfo } from 'node:net';

export interface ProviderPayment {
  id: string;
  amount: number;
  currency: string;
}

/** DI token of the `PaymentProviderOptions`. */
export const PAYMENT_PROVIDER_OPTIONS = Symbol('PAYMENT_PROVIDER_OPTIONS');

export interface PaymentProviderOptions {
  /** A real provider's base URL; unset means this app's own fake provider (`/provider`). */
  url?: string;
  /** The provider's credential, sent as `Authorization: Bearer <apiKey>`. */
  apiKey: string;
}

/**
 * The provider could not be reached or failed. Deliberately not an
 * `HttpException`: the outcome is unknown, so the idempotency key stays in
 * flight until its lease ends and a retry resumes the checkout (with the same
 * derived key, so the provider cannot charge twice), rather than a 502 being
 * stored as the final answer.
 */
export class PaymentProviderError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PaymentProviderError';
  }
}

/** Calls the payment provider over HTTP, with its own credential, on behalf of one merchant account. */
@Injectable()
export class PaymentProviderClient {
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Inject(PAYMENT_PROVIDER_OPTIONS) private readonly options: PaymentProviderOptions,
  ) {}

  /** @param account the merchant account at the provider: the tenant */
  async charge(account: string, amount: number, currency: string, idempotencyKey: string): Promise<ProviderPayment> {
    const response = await fetch(`${this.baseUrl()}/charges`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${this.options.apiKey}`,
        'provider-account': account,
        'content-type': 'application/json',
        'idempotency-key': idempotencyKey,
      },
      body: JSON.stringify({ amount, currency }),
      signal: AbortSignal.timeout(10_000),
    });
    if (!response.ok) throw new PaymentProviderError(`The payment provider answered ${response.status}.`);
    return (await response.json()) as ProviderPayment;
  }

  private baseUrl(): string {
    if (this.options.url) return this.options.url;
    // The port is only known once the app listens (tests use port 0).
    const address = this.adapterHost.httpAdapter.getHttpServer().address() as AddressInfo;
    return `http://127.0.0.1:${address.port}/provider`;
  }
}
