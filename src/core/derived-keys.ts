import { createHash, createHmac } from 'node:crypto';

export interface DeriveKeyOptions {
  /** Longest key the downstream system accepts (Stripe 255, Adyen 64). Default 64, at least 22. */
  maxLength?: number;
  /**
   * Mixed in with HMAC-SHA-256 so that nobody who sees a derived key can test
   * guesses of the original key against it. Keep it stable: changing it
   * changes every derived key.
   */
  secret?: string | Buffer;
}

const MIN_LENGTH = 22;

/** What a derived key hangs off: the request's key in its tenant, and which use of that key this is. */
export interface DerivationScope {
  tenant: string;
  key: string;
  /**
   * The claim's generation (`DownstreamKeys` and `Phases` fill it in): stable
   * across retries and takeovers of one request, new when the key is reused
   * after it expired, so a provider never mistakes new work for a retry of
   * old work under the same key.
   */
  generation?: string;
}

/**
 * A key for one downstream call made on behalf of an idempotent request:
 * the same for every retry of the request, on any process, different per
 * tenant, request key and `purpose` (e.g. `'charge'`, `'refund'`). It is a
 * hash, so it carries no personal data from the key, and it is cut to
 * `maxLength` while keeping at least 128 bits.
 *
 * ```ts
 * provider.charge({ amount }, { idempotencyKey: deriveKey(scope, 'charge', { maxLength: 64 }) });
 * ```
 */
export function deriveKey(scope: DerivationScope, purpose: string, options: DeriveKeyOptions = {}): string {
  const maxLength = options.maxLength ?? 64;
  if (!Number.isInteger(maxLength) || maxLength < MIN_LENGTH) {
    throw new RangeError(`deriveKey: maxLength must be an integer of at least ${MIN_LENGTH}, got ${maxLength}.`);
  }
  if (purpose === '') throw new RangeError('deriveKey: purpose must not be empty.');
  // Length-prefixed fields, so ('a:b', 'c') and ('a', 'b:c') can never collide.
  const parts =
    scope.generation === undefined ? [scope.tenant, scope.key, purpose] : [scope.tenant, scope.key, scope.generation, purpose];
  const material = parts.map((part) => `${Buffer.byteLength(part)}:${part}`).join('|');
  // Distinct tags, so material with a generation can never equal material without one.
  const version = scope.generation === undefined ? 'v1' : 'v2';
  const digest = (options.secret === undefined ? createHash('sha256') : createHmac('sha256', options.secret))
    .update(`nest-idempotency/derived/${version}|${material}`)
    .digest('base64url');
  const label = slug(purpose);
  const withLabel = `${label}_${digest}`;
  // Keep the readable purpose only while at least 22 characters (132 bits) of the digest survive.
  return withLabel.length <= maxLength || maxLength - label.length - 1 >= MIN_LENGTH
    ? withLabel.slice(0, maxLength)
    : digest.slice(0, maxLength);
}

/**
 * A key built from business identity rather than a random UUID, for jobs and
 * consumers that act on one thing at a time: `businessKey('order', 1042,
 * 'capture')` is `order:1042:capture` on every run. Parts are escaped so that
 * `('a:b', 'c')` and `('a', 'b:c')` differ; a key longer than `maxLength`
 * (default 255) keeps its start and ends in a hash of the whole.
 */
export function businessKey(...parts: Array<string | number | bigint>): string {
  return businessKeyWithin(255, ...parts);
}

/** `businessKey` with an explicit length limit. */
export function businessKeyWithin(maxLength: number, ...parts: Array<string | number | bigint>): string {
  if (parts.length === 0) throw new RangeError('businessKey needs at least one part.');
  const key = parts.map((part) => String(part).replace(/%/g, '%25').replace(/:/g, '%3A')).join(':');
  if (!/^[\x21-\x7e]*$/.test(key)) {
    throw new RangeError('businessKey parts may only contain visible ASCII characters, as idempotency keys do.');
  }
  if (key.length <= maxLength) return key;
  const hash = createHash('sha256').update(key).digest('base64url').slice(0, 22);
  if (maxLength < hash.length + 2) throw new RangeError(`businessKey: maxLength ${maxLength} is too short.`);
  return `${key.slice(0, maxLength - hash.length - 1)}~${hash}`;
}

function slug(purpose: string): string {
  return purpose.replace(/[^A-Za-z0-9-]/g, '-').slice(0, 24);
}
