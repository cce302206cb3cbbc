import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/**
 * What identifies "the same request" for one key. Body is whatever the
 * platform parsed: a JSON value, or raw bytes/text for other content types.
 */
export interface FingerprintInput {
  method: string;
  path: string;
  body: unknown;
}

/**
 * SHA-256 (hex) over the RFC 8785 canonical form of method, path and body, so
 * JSON that differs only in key order or whitespace fingerprints the same.
 * Raw bodies are hashed as bytes, tagged so that a string body can never
 * collide with a JSON body of the same text.
 */
export function fingerprintRequest(input: FingerprintInput): string {
  const hash = createHash('sha256');
  hash.update(canonicalJson({ method: input.method.toUpperCase(), path: input.path }));
  hash.update('\n');
  updateWithBody(hash, input.body);
  return hash.digest('hex');
}

/** SHA-256 (hex) of the canonical JSON of any value: the fingerprint of non-HTTP work. */
export function fingerprintValue(value: unknown): string {
  const hash = createHash('sha256');
  updateWithBody(hash, value);
  return hash.digest('hex');
}

function updateWithBody(hash: ReturnType<typeof createHash>, body: unknown): void {
  if (body === undefined || body === null) {
    hash.update('empty');
  } else if (Buffer.isBuffer(body) || body instanceof Uint8Array) {
    hash.update('bytes:');
    hash.update(body);
  } else if (typeof body === 'string') {
    hash.update('text:');
    hash.update(body, 'utf8');
  } else {
    hash.update('json:');
    hash.update(canonicalJson(body));
  }
}

export function canonicalJson(value: unknown): string {
  const text = canonicalize(value);
  if (text === undefined) throw new TypeError('The value has no JSON representation, so it cannot be fingerprinted.');
  return text;
}
