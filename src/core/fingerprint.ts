import { createHash } from 'node:crypto';
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
    // Written in canonical key order, so the serializer's fast path takes it (the text is the same in any order).
    canonicalJson({ method: input.method.toUpperCase(), params: input.params, query: input.query ?? {}, route: input.route }),
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

/**
 * The RFC 8785 (JCS) canonical JSON of `value`: object keys sorted by UTF-16
 * code units at every depth, no whitespace, numbers and strings as
 * ECMAScript's JSON.stringify writes them.
 *
 * Written here rather than taken from the `canonicalize` package, whose
 * output it matches (a property test checks that): on a 1 MiB body the
 * package spent about 35 ms of CPU per request, mostly in a per-character
 * surrogate scan and string joins. Plain JSON data (what a body parser
 * makes) takes one validating walk and then the engine's own serializer
 * with the sorted keys as its property list (`plainKeys`), about a quarter
 * of the CPU and far less garbage than building the text value by value;
 * anything else goes through `write`, which uses `isWellFormed` and
 * `JSON.stringify` for every leaf. Both refuse hostile depth on their way
 * down instead of overflowing the stack.
 *
 * @throws UnrepresentableInputError a lone surrogate, a non-finite number,
 *   a value with no JSON form (a BigInt, a function at the top), or nesting
 *   deeper than `MAX_FINGERPRINT_DEPTH`
 */
export function canonicalJson(value: unknown): string {
  const keys = plainKeys(value);
  // Keys already in order at every depth (most small bodies): the serializer's fast path, without a property list.
  const text = keys === 'sorted' ? JSON.stringify(value) : keys ? JSON.stringify(value, keys.sort()) : write(value, 1);
  if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
  return text;
}

/**
 * Past this many object-and-key pairs the engine's serializer would do more
 * work than the writer below: it looks every key of the list up in every
 * object (a body of many objects with distinct keys).
 */
const MAX_KEY_LOOKUPS = 1_000_000;

/**
 * Whether `value` is plain JSON data (what a JSON body parser makes): then
 * its canonical form is what the engine's own `JSON.stringify` writes with
 * every key it holds, sorted, as the property list, which serialises every
 * object's keys in that order (integer-like keys included, unlike an
 * object's own order) at native speed, with no string built per value.
 * The walk refuses what has no canonical form on its way.
 *
 * @returns `'sorted'` when every object's own keys are already in canonical
 * order (`Object.keys` order, integer-like keys first, is the order
 * `JSON.stringify` writes them in, so it then writes the canonical form
 * with no property list); else every key it holds; undefined for anything else (a `toJSON`, a class
 * instance, a Map, a boxed primitive, an own `__proto__` key that the list
 * would read through the prototype of every other object, or a list too
 * long for the objects), which the writer below handles.
 */
function plainKeys(root: unknown): 'sorted' | string[] | undefined {
  let objects = 0;
  let sorted = true;
  const found = new Set<string>();
  const walk = (value: unknown, depth: number): boolean => {
    switch (typeof value) {
      case 'string':
        if (!(value as string & { isWellFormed(): boolean }).isWellFormed()) throw new UnrepresentableInputError(LONE_SURROGATE);
        return true;
      case 'number':
        if (!Number.isFinite(value))
          throw new UnrepresentableInputError('a number is out of range (it parses to Infinity or NaN)');
        return true;
      case 'bigint':
        throw new UnrepresentableInputError('a BigInt has no JSON representation');
      case 'object':
        break;
      default:
        return true;
    }
    if (value === null) return true;
    if (depth > MAX_FINGERPRINT_DEPTH) {
      throw new UnrepresentableInputError(`it is nested deeper than ${MAX_FINGERPRINT_DEPTH} levels of arrays and objects`);
    }
    if (Array.isArray(value)) {
      if (Object.getPrototypeOf(value) !== Array.prototype) return false;
      for (const item of value) if (!walk(item, depth + 1)) return false;
      return true;
    }
    const prototype = Object.getPrototypeOf(value);
    if ((prototype !== Object.prototype && prototype !== null) || typeof (value as { toJSON?: unknown }).toJSON === 'function')
      return false;
    objects++;
    const object = value as Record<string, unknown>;
    let previous: string | undefined;
    for (const key of Object.keys(object)) {
      if (key === '__proto__') return false;
      // Compared as JavaScript compares strings: by UTF-16 code units, the canonical order.
      if (previous !== undefined && previous >= key) sorted = false;
      previous = key;
      if (!found.has(key)) {
        if (!(key as string & { isWellFormed(): boolean }).isWellFormed()) throw new UnrepresentableInputError(LONE_SURROGATE);
        found.add(key);
      }
      if (!walk(object[key], depth + 1)) return false;
    }
    return true;
  };
  if (!walk(root, 1)) return undefined;
  if (sorted) return 'sorted';
  return objects * found.size <= MAX_KEY_LOOKUPS ? [...found] : undefined;
}

const LONE_SURROGATE = 'a string holds a lone surrogate (half of a UTF-16 pair)';

function write(value: unknown, depth: number): string | undefined {
  switch (typeof value) {
    case 'string':
      return quote(value);
    case 'number':
      if (!Number.isFinite(value)) throw new UnrepresentableInputError('a number is out of range (it parses to Infinity or NaN)');
      // The same as JSON.stringify for a finite number (ECMAScript's Number::toString), without its overhead.
      return String(value);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'bigint':
      throw new UnrepresentableInputError('a BigInt has no JSON representation');
    case 'object':
      break;
    default:
      // undefined, functions and symbols: left out of objects, null in arrays, as in JSON.
      return undefined;
  }
  if (value === null) return 'null';
  if (depth > MAX_FINGERPRINT_DEPTH) {
    throw new UnrepresentableInputError(`it is nested deeper than ${MAX_FINGERPRINT_DEPTH} levels of arrays and objects`);
  }
  const json = (value as { toJSON?: unknown }).toJSON;
  if (typeof json === 'function') return write(json.call(value), depth + 1);
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++) out += (i === 0 ? '' : ',') + (write(value[i], depth + 1) ?? 'null');
    return `${out}]`;
  }
  const object = value as Record<string, unknown>;
  let out = '{';
  let first = true;
  for (const key of Object.keys(object).sort()) {
    const member = write(object[key], depth + 1);
    if (member === undefined) continue;
    out += `${first ? '' : ','}${quote(key)}:${member}`;
    first = false;
  }
  return `${out}}`;
}

/** Characters JSON.stringify escapes in a string (besides lone surrogates, refused before): quote, backslash, controls. */
// eslint-disable-next-line no-control-regex -- the control characters are exactly what must be found
const NEEDS_ESCAPING = /["\\\u0000-\u001f]/;

/** A string as JSON: most need no escaping, and are quoted as they are. */
function quote(text: string): string {
  if (!(text as string & { isWellFormed(): boolean }).isWellFormed()) throw new UnrepresentableInputError(LONE_SURROGATE);
  return NEEDS_ESCAPING.test(text) ? JSON.stringify(text) : `"${text}"`;
}
