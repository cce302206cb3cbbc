import { createHash, type Hash } from 'node:crypto';
import { NONE_BY_HAND } from './canonical-json-rules.js';
import { prepare } from './canonical-json-walk.js';
import { hashInPieces, textInPieces } from './canonical-json-writers.js';
import { UnrepresentableInputError } from './errors.js';
import type { FingerprintInput } from './fingerprint-input.js';

export { MAX_FINGERPRINT_DEPTH } from './canonical-json-rules.js';

/**
 * SHA-256 (hex) over the RFC 8785 canonical form of method, route, parameters, query and body, so JSON that differs
 * only in key order or whitespace fingerprints the same. Raw bodies are hashed as bytes, tagged apart from JSON text.
 * @throws UnrepresentableInputError the body (or query) has no canonical form (see `canonicalJson`).
 */
export function fingerprintRequest(input: FingerprintInput): string {
  const hash = createHash('sha256');
  hash.update(
    // Written in canonical key order, so the serializer's fast path takes it (the text is the same in any order).
    canonicalJson({ method: input.method.toUpperCase(), params: input.params, query: input.query ?? {}, route: input.route }),
  );
  hash.update('\n');
  updateWithBody(hash, input.body);
  return hash.digest('hex');
}

/** Adds `body` to `hash`: tagged by kind, JSON as its canonical text. */
export function updateWithBody(hash: Hash, body: unknown): void {
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
    const prepared = prepare(body);
    // Most bodies are small: one piece, hashed as it is.
    if (prepared?.byHand === NONE_BY_HAND) hash.update(onePiece(prepared.value));
    else hashInPieces(hash, body, prepared);
  }
}

/**
 * The RFC 8785 (JCS) canonical JSON of `value`: keys sorted by UTF-16 code units, no whitespace, numbers and strings
 * as JSON.stringify writes them; the `canonicalize` package's output (a property test checks it), far cheaper.
 * @throws UnrepresentableInputError a lone surrogate, a non-finite number, a value with no JSON form (a BigInt,
 *   a function at the top), or nesting deeper than `MAX_FINGERPRINT_DEPTH`
 */
export function canonicalJson(value: unknown): string {
  const prepared = prepare(value);
  return prepared?.byHand === NONE_BY_HAND ? onePiece(prepared.value) : textInPieces(value, prepared);
}

/** The canonical text of a prepared value that `JSON.stringify` writes whole (nothing to write by hand). */
function onePiece(value: unknown): string {
  const text = JSON.stringify(value) as string | undefined;
  if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
  return text;
}
