import type { Hash } from 'node:crypto';
import { UnrepresentableInputError } from './errors.js';
import {
  LONE_SURROGATE,
  MAX_FINGERPRINT_DEPTH,
  OrderedMembers,
  PIECE_CHARS,
  type ByHand,
  type Prepared,
} from './canonical-json-rules.js';

// The writers behind `canonicalJson` (fingerprint.ts) for what one `JSON.stringify` of the prepared value cannot
// write: large values in pieces, objects whose keys a fresh object cannot hold in order, and anything that is not
// plain data. A small plain body (most requests) needs none of them.

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
export function writeCanonical(value: unknown, prepared: Prepared | undefined, out: (piece: string) => void): void {
  if (prepared === undefined) {
    const text = write(value, 1);
    if (text === undefined) throw new UnrepresentableInputError('the value has no JSON representation');
    out(text);
    return;
  }
  if (!emit(prepared.value, prepared.byHand, out)) throw new UnrepresentableInputError('the value has no JSON representation');
}

/** Hashes the canonical JSON of `value` in pieces (see `writeCanonical`). */
export function hashInPieces(hash: Hash, value: unknown, prepared: Prepared | undefined): void {
  const chunks = new HashChunks(hash);
  writeCanonical(value, prepared, chunks.write);
  chunks.flush();
}

/** The canonical JSON of `value`, written in pieces (see `writeCanonical`) and joined. */
export function textInPieces(value: unknown, prepared: Prepared | undefined): string {
  let text = '';
  writeCanonical(value, prepared, (part) => {
    text += part;
  });
  return text;
}

/** Feeds a hash pieces of text, joined into chunks of about `PIECE_CHARS` (one `update` per tiny piece costs more). */
export class HashChunks {
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

function isByHand(value: unknown, byHand: ByHand): boolean {
  return value instanceof OrderedMembers || (typeof value === 'object' && value !== null && byHand.has(value));
}

/**
 * Writes a prepared value (see `prepare`) to `out`: what `JSON.stringify`
 * can write in one piece through it, the rest here. False when the value
 * has no JSON form (undefined, a function, a symbol), as `JSON.stringify`
 * answers undefined.
 */
export function emit(value: unknown, byHand: ByHand, out: (piece: string) => void): boolean {
  if (!isByHand(value, byHand)) {
    const text = JSON.stringify(value) as string | undefined;
    if (text === undefined) return false;
    out(text);
    return true;
  }
  if (value instanceof OrderedMembers) {
    emitMembers(value.keys, value.values, byHand, out);
  } else if (Array.isArray(value)) {
    emitItems(value, byHand.get(value) ?? 0, byHand, out);
  } else {
    const object = value as Record<string, unknown>;
    const keys = Object.keys(object);
    emitMembers(
      keys,
      keys.map((key) => object[key]),
      byHand,
      out,
    );
  }
  return true;
}

function emitMembers(keys: readonly string[], values: readonly unknown[], byHand: ByHand, out: (piece: string) => void): void {
  out('{');
  let first = true;
  for (let i = 0; i < keys.length; i++) {
    const value = values[i];
    // Left out, as JSON.stringify leaves out members with no JSON form.
    if (value === undefined || typeof value === 'function' || typeof value === 'symbol') continue;
    out(`${first ? '' : ','}${quote(keys[i])}:`);
    emit(value, byHand, out);
    first = false;
  }
  out('}');
}

/** A large array's items, in runs of about `PIECE_CHARS` serialized at once (one `JSON.stringify` of a slice). */
function emitItems(items: readonly unknown[], length: number, byHand: ByHand, out: (piece: string) => void): void {
  out('[');
  const run = Math.max(1, Math.floor((PIECE_CHARS * items.length) / Math.max(length, 1)));
  let i = 0;
  while (i < items.length) {
    if (i > 0) out(',');
    if (isByHand(items[i], byHand)) {
      emit(items[i], byHand, out);
      i++;
      continue;
    }
    let end = i + 1;
    while (end < items.length && end - i < run && !isByHand(items[end], byHand)) end++;
    // A slice's text less its brackets; an item with no JSON form is null in an array, as JSON.stringify writes it.
    out(
      end - i === 1
        ? ((JSON.stringify(items[i]) as string | undefined) ?? 'null')
        : JSON.stringify(items.slice(i, end)).slice(1, -1),
    );
    i = end;
  }
  out(']');
}

export function write(value: unknown, depth: number): string | undefined {
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
