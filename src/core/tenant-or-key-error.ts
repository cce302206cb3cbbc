import { IdempotencyInputError } from './errors.js';
import { unusableIdentifier } from './key.js';

/**
 * The error for a tenant or key of `IdempotencyService.run` (which every
 * entry point and `execute()` go through) that cannot be used, or undefined.
 */
export function tenantOrKeyError(tenant: unknown, key: unknown): IdempotencyInputError | undefined {
  const tenantReason = unusableIdentifier(tenant);
  if (tenantReason) return new IdempotencyInputError('tenant', tenantReason);
  const keyReason = unusableIdentifier(key);
  return keyReason ? new IdempotencyInputError('key', keyReason) : undefined;
}
