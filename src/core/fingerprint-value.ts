import { createHash } from 'node:crypto';
import { updateWithBody } from './fingerprint.js';

/** SHA-256 (hex) of the canonical JSON of any value: the fingerprint of non-HTTP work. */
export function fingerprintValue(value: unknown): string {
  const hash = createHash('sha256');
  updateWithBody(hash, value);
  return hash.digest('hex');
}
