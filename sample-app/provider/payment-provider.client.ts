import { Injectable } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { AddressInfo } from 'node:net';

export interface ProviderPayment {
  id: string;
  amount: number;
  currency: string;
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

/**
 * Calls the payment provider over HTTP. `PAYMENT_PROVIDER_URL` points at a
 * real one; by default it is this app's own fake provider (`/provider`).
 */
@Injectable()
export class PaymentProviderClient {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  async charge(amount: number, currency: string, idempotencyKey: string): Promise<ProviderPayment> {
    const response = await fetch(`${this.baseUrl()}/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
      body: JSON.stringify({ amount, currency }),
      signal: AbortSignal.timeout(10_000),
    });
    if (!response.ok) throw new PaymentProviderError(`The payment provider answered ${response.status}.`);
    return (await response.json()) as ProviderPayment;
  }

  private baseUrl(): string {
    if (process.env.PAYMENT_PROVIDER_URL) return process.env.PAYMENT_PROVIDER_URL;
    // The port is only known once the app listens (tests use port 0).
    const address = this.adapterHost.httpAdapter.getHttpServer().address() as AddressInfo;
    return `http://127.0.0.1:${address.port}/provider`;
  }
}
