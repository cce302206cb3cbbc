// What the walk (canonical-json-walk.ts) and the writers (canonical-json-writers.ts) of `canonicalJson` share:
// the limits, the shapes the walk hands to the writers, and the key orders a fresh object cannot hold.

/**
 * Deepest nesting of arrays and objects a fingerprinted value may have. Far
 * past any real request body, and far short of what would overflow the stack
 * of the recursive canonical form (a few thousand levels).
 */
export const MAX_FINGERPRINT_DEPTH = 128;

/**
 * About how many characters of canonical text a piece holds: a value
 * estimated larger is written in pieces, and hashing takes the text in
 * pieces of about this length. Well under the size at which the engine
 * gives a string (and Node's hash a UTF-8 buffer) pages of its own.
 */
export const PIECE_CHARS = 16 * 1024;

/** Why a string (or a key) has no canonical form. */
export const LONE_SURROGATE = 'a string holds a lone surrogate (half of a UTF-16 pair)';

/**
 * An object that a fresh plain object cannot hold in canonical key order:
 * its keys in that order and their canonical values, written key by key.
 */
export class OrderedMembers {
  constructor(
    readonly keys: readonly string[],
    readonly values: readonly unknown[],
  ) {}
}

/** The keys of one object shape: their canonical order, and how an object with them is written. */
export interface KeyOrder {
  keys: readonly string[];
  /** The keys sorted by UTF-16 code units (`keys` itself when they already are). */
  sorted: readonly string[];
  /** `Object.keys` is already the canonical order: `JSON.stringify` writes the object as it is. */
  inOrder: boolean;
  /** A fresh plain object with `sorted` assigned in that order enumerates them in that order. */
  copyable: boolean;
}

/** What `prepare` gives: the value to serialize, and the containers to write by hand. */
export interface Prepared {
  value: unknown;
  byHand: ByHand;
}

/** Containers `emit` writes itself, each with its estimated length of text. */
export type ByHand = ReadonlyMap<object, number>;
export const NONE_BY_HAND: ByHand = new Map();

/** Integer-like keys (a superset of array indices, which every object enumerates first, in numeric order). */
const INTEGER_LIKE = /^(?:0|[1-9][0-9]*)$/;

/**
 * Whether a fresh object given `sorted` in that order enumerates them so:
 * it lists array-index keys first, in numeric order, then the others as
 * assigned. True when every integer-like key comes before the others and
 * they ascend numerically (integer-like is broader than array index, so
 * this errs only towards writing an object key by key).
 */
export function enumeratesAsSorted(sorted: readonly string[]): boolean {
  let named = false;
  let previous = -1;
  for (const key of sorted) {
    if (INTEGER_LIKE.test(key)) {
      const index = Number(key);
      if (named || index <= previous) return false;
      previous = index;
    } else named = true;
  }
  return true;
}
