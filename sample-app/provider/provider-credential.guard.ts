import { Inject, Injectable, UnauthorizedException, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { createHash, timingSafeEqual } from 'node:crypto';

/** DI token of the one API key the fake payment provider accepts. */
export const FAKE_PROVIDER_API_KEY = Symbol('FAKE_PROVIDER_API_KEY');

const BEARER = /^Bearer +([\x21-\x7e]+) *$/i;

/**
 * The fake provider's own authentication, as another company's API has:
 * `Authorization: Bearer <provider key>`, where the key is the provider's
 * (`PAYMENT_PROVIDER_KEY`), not one of the payments API's keys. Without it,
 * nobody can charge through it, switch its outage or read its statistics.
 */
@Injectable()
export class ProviderCredentialGuard implements CanActivate {
  private readonly expected: Buffer;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Inject(FAKE_PROVIDER_API_KEY) apiKey: string,
  ) {
    this.expected = digest(apiKey);
  }

  canActivate(context: ExecutionContext): boolean {
    const http = context.switchToHttp();
    const header = http.getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers.authorization;
    const token = typeof header === 'string' ? BEARER.exec(header)?.[1] : undefined;
    // Digests of equal length, compared in constant time: the comparison tells nothing about the key.
    if (token !== undefined && timingSafeEqual(digest(token), this.expected)) return true;
    this.adapterHost.httpAdapter.setHeader(http.getResponse(), 'WWW-Authenticate', 'Bearer realm="payment-provider"');
    this.adapterHost.httpAdapter.setHeader(http.getResponse(), 'Content-Type', 'application/problem+json');
    throw new UnauthorizedException({
      type: 'about:blank',
      title: 'Unauthorized',
      status: 401,
      detail: 'The payment provider needs its own API key as "Authorization: Bearer <key>".',
    });
  }
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}
