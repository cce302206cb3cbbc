import { Injectable } from '@nestjs/common';
import { deriveKey, type DeriveKeyOptions } from '../core/derived-keys.js';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { idempotencyContext } from './idempotency-context.js';

/**
 * Keys for calls to other systems made while an idempotent request or
 * execution runs: `keys.derive('charge')` is the same on every retry of the
 * request, on any process (see `deriveKey`).
 */
@Injectable()
export class DownstreamKeys {
  derive(purpose: string, options?: DeriveKeyOptions): string {
    const scope = idempotencyContext.getStore()?.scope;
    if (!scope) {
      throw new IdempotencyConfigurationError(
        'DownstreamKeys.derive() was called outside an idempotent request or execution, so there is no key to derive from. ' +
          'Use deriveKey({ tenant, key }, purpose) with an explicit scope instead.',
      );
    }
    return deriveKey(scope, purpose, options);
  }
}
