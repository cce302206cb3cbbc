import { createHash, type Hash } from 'node:crypto';
import { emit, NONE_BY_HAND, PIECE_CHARS, prepare, write, type Prepared } from './canonical-json-walk.js';
import { UnrepresentableInputError } from './errors.js';

export { MAX_FINGERPRINT_DEPTH } from './canonical-json-walk.js';

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

function updateWithBody(hash: Hash, body: unknown): void {
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
    if (prepared?.byHand === NONE_BY_HAND) {
      // Most bodies are small: one piece, hashed as it is.
      hash.update(onePiece(prepared.value));
    } else {
      const chunks = new HashChunks(hash);
      writeCanonical(body, prepared, chunks.write);
      chunks.flush();
    }
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
 * surrogate scan and string joins. See `writeCanonical` for how.
 *
 * @throws UnrepresentableInputError a lone surrogate, a non-finite number,
 *   a value with no JSON form (a BigInt, a function at the top), or nesting
 *   deeper than `MAX_FINGERPRINT_DEPTH`
 */
export function canonicalJson(value: unknown): string {
  const prepared = prepare(value);
  if (prepared?.byHand === NONE_BY_HAND) return onePiece(prepared.value);
  let text = '';
  writeCanonical(value, prepared, (part) => {
    text += part;
  });
  return text;
}

/** The canonical text of a prepared value that `JSON.stringify` writes whole (nothing to write by hand). */
function onePiece(value: unknown): string {
  const text = JSON.stringify(value) as string | undefined;
  if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
  return text;
}

/**
 * Writes the canonical JSON of `value` to `out`, piece by piece; the pieces
 * joined are the canonical text, and no piece splits a string of the value
 * (so each can be encoded as UTF-8 on its own: a surrogate pair never ends
 * up in two pieces). `prepared` is what `prepare` made of `value`.
 *
 * Plain JSON data (what a body parser makes) is first walked once
 * (`prepare`; a value it leaves nothing to write by hand for, most small
 * bodies, is then one `JSON.stringify`, see `onePiece`): the walk refuses what has no canonical form (lone
 * surrogates, non-finite numbers, hostile depth, on its way down rather
 * than by overflowing the stack), and gives back a value whose own
 * `JSON.stringify` is the canonical text: the same objects where their
 * keys are already in canonical order (most small bodies: no copy at all),
 * fresh plain objects with the keys inserted in sorted order where they are
 * not. The engine's serializer then writes it on its fast path, without a
 * property list. (The property list was the previous way: the serializer
 * looks every listed key up in every object, and its output on a 1 MiB
 * body is a tree of thousands of pieces that hashing must first copy into
 * one flat string and then once more into a 1 MiB UTF-8 buffer: large
 * fresh allocations, each a few milliseconds of page faults here.)
 *
 * Large values (past `PIECE_CHARS`, estimated on the walk) are not written
 * as one string: their containers are written here and their members
 * serialized in runs of about `PIECE_CHARS`, so hashing a 1 MiB body never
 * builds a 1 MiB string; and the few objects a fresh object cannot hold in
 * canonical order (integer-like keys, which every object enumerates first
 * and in numeric order; an own `__proto__`, which assignment would turn
 * into a prototype) are written here too, key by key. Anything that is not
 * plain data (a `toJSON`, a class instance, a Map, a boxed primitive) goes
 * through `write`, which uses `isWellFormed` and `JSON.stringify` for every
 * leaf.
 */
function writeCanonical(value: unknown, prepared: Prepared | undefined, out: (piece: string) => void): void {
  if (prepared === undefined) {
    const text = write(value, 1);
    if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
    out(text);
    return;
  }
  if (!emit(prepared.value, prepared.byHand, out)) throw new UnrepresentableInputError('the value has no JSON representation');
}

/** Feeds a hash pieces of text, joined into chunks of about `PIECE_CHARS` (one `update` per tiny piece costs more). */
class HashChunks {
  private pending = '';
  constructor(private readonly hash: Hash) {}

  readonly write = (piece: string): void => {
    this.pending += piece;
    if (this.pending.length >= PIECE_CHARS) {
      this.hash.update(this.pending);
      this.pending = '';
    }
  };

  flush(): void {
    if (this.pending !== '') this.hash.update(this.pending);
    this.pending = '';
  }
}
