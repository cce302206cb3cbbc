import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { UnrepresentableInputError } from './errors.js';

/**
 * Deepest nesting of arrays and objects a fingerprinted value may have. Far
 * past any real request body, and far short of what would overflow the stack
 * of the recursive canonical form (a few thousand levels).
 */
export const MAX_FINGERPRINT_DEPTH = 128;

/**
 * What identifies "the same request" for one key. `route` is
 * the route that matched (its pattern, or a stand-in name), never the request
 * target as the client spelled it. `body` is whatever the platform parsed: a
 * JSON value, or raw bytes/text for other content types.
 */
export interface FingerprintInput {
  method: string;
  route: string;
  params: Record<string, unknown>;
  query: unknown;
  body: unknown;
}

/**
 * SHA-256 (hex) over the RFC 8785 canonical form of method, route,
 * parameters, query and body, so JSON that differs only in key order or
 * whitespace fingerprints the same. Raw bodies are hashed as bytes, tagged so
 * that a string body can never collide with a JSON body of the same text.
 *
 * @throws UnrepresentableInputError the body (or query) has no canonical
 *   form: a lone surrogate, a number out of range, nesting deeper than
 *   `MAX_FINGERPRINT_DEPTH`.
 */
export function fingerprintRequest(input: FingerprintInput): string {
  const hash = createHash('sha256');
  hash.update(
    canonicalJson({ method: input.method.toUpperCase(), route: input.route, params: input.params, query: input.query ?? {} }),
  );
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

/** The RFC 8785 canonical JSON of `value`. @throws UnrepresentableInputError */
export function canonicalJson(value: unknown): string {
  checkDepth(value);
  let text: string | undefined;
  try {
    text = canonicalize(value);
  } catch (error) {
    throw new UnrepresentableInputError(describeCanonicalizeError(error));
  }
  if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
  return text;
}

/** Walks the value without recursion, so a hostile depth fails here with a clear reason instead of a stack overflow. */
function checkDepth(value: unknown): void {
  const pending: Array<[unknown, number]> = [[value, 1]];
  while (pending.length > 0) {
    const [current, depth] = pending.pop()!;
    if (current === null || typeof current !== 'object' || Buffer.isBuffer(current)) continue;
    if (depth > MAX_FINGERPRINT_DEPTH) {
      throw new UnrepresentableInputError(`it is nested deeper than ${MAX_FINGERPRINT_DEPTH} levels of arrays and objects`);
    }
    for (const child of Object.values(current)) {
      if (child !== null && typeof child === 'object') pending.push([child, depth + 1]);
    }
  }
}

function describeCanonicalizeError(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  if (/surrogate/i.test(message)) return 'a string holds a lone surrogate (half of a UTF-16 pair)';
  if (/infinity|nan/i.test(message)) return 'a number is out of range (it parses to Infinity or NaN)';
  if (/circular/i.test(message)) return 'the value refers to itself';
  return 'the value has no canonical JSON form';
}
