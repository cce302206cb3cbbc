import {
  enumeratesAsSorted,
  LONE_SURROGATE,
  MAX_FINGERPRINT_DEPTH,
  NONE_BY_HAND,
  OrderedMembers,
  PIECE_CHARS,
  type KeyOrder,
  type Prepared,
} from './canonical-json-rules.js';
import { UnrepresentableInputError } from './errors.js';

/** Marks a value the walk found is not plain JSON data. */
const NOT_PLAIN: unique symbol = Symbol('not plain JSON data');

/**
 * The walk behind `canonicalJson` (fingerprint.ts) over plain JSON data: the value for the engine's serializer,
 * and the containers `emit` (canonical-json-writers.ts) must write itself, each with its estimated length: the
 * large ones, `OrderedMembers`, and any holding one. Undefined for anything that is not plain data.
 */
export function prepare(root: unknown): Prepared | undefined {
  // Made only for a value that needs it: most bodies are small, and are written in one piece.
  let byHand: Map<object, number> | undefined;
  let length = 0;
  let ordered = 0;
  // The last key order seen at each depth: siblings mostly share one shape (an array of line items), so sorting
  // and checking their keys is done once for all of them.
  let orders: Array<KeyOrder | undefined> | undefined;
  const walk = (value: unknown, depth: number): unknown => {
    switch (typeof value) {
      case 'string':
        if (!(value as string & { isWellFormed(): boolean }).isWellFormed()) throw new UnrepresentableInputError(LONE_SURROGATE);
        length += value.length + 2;
        return value;
      case 'number':
        if (!Number.isFinite(value))
          throw new UnrepresentableInputError('a number is out of range (it parses to Infinity or NaN)');
        length += 8;
        return value;
      case 'bigint':
        throw new UnrepresentableInputError('a BigInt has no JSON representation');
      case 'object':
        break;
      default:
        length += 5;
        return value;
    }
    if (value === null) {
      length += 4;
      return value;
    }
    if (depth > MAX_FINGERPRINT_DEPTH) {
      throw new UnrepresentableInputError(`it is nested deeper than ${MAX_FINGERPRINT_DEPTH} levels of arrays and objects`);
    }
    if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return NOT_PLAIN;
    const start = length;
    const orderedBefore = ordered;
    let result: unknown;
    if (Array.isArray(value)) {
      if (Object.getPrototypeOf(value) !== Array.prototype) return NOT_PLAIN;
      let copy: unknown[] | undefined;
      for (let i = 0; i < value.length; i++) {
        const item: unknown = value[i];
        const canonical = walk(item, depth + 1);
        if (canonical === NOT_PLAIN) return NOT_PLAIN;
        if (copy) copy.push(canonical);
        else if (canonical !== item) {
          copy = value.slice(0, i);
          copy.push(canonical);
        }
      }
      length += value.length + 2;
      result = copy ?? value;
    } else {
      const prototype = Object.getPrototypeOf(value);
      if (prototype !== Object.prototype && prototype !== null) return NOT_PLAIN;
      const object = value as Record<string, unknown>;
      const keys = Object.keys(object);
      let order = orders?.[depth];
      if (!order || !sameKeys(order.keys, keys)) (orders ??= [])[depth] = order = keyOrder(keys);
      const { sorted, inOrder, copyable } = order;
      // Fresh objects for keys out of order; for keys in order, only once a member changed.
      let fresh: Record<string, unknown> | undefined = !inOrder && copyable ? {} : undefined;
      let values: unknown[] | undefined = !inOrder && !copyable ? [] : undefined;
      for (let i = 0; i < sorted.length; i++) {
        const key = sorted[i];
        const member = object[key];
        const canonical = walk(member, depth + 1);
        if (canonical === NOT_PLAIN) return NOT_PLAIN;
        if (fresh) fresh[key] = canonical;
        else if (values) values.push(canonical);
        else if (canonical !== member) {
          // Keys in order, a member changed: copy what came before it.
          if (copyable) {
            fresh = {};
            for (let j = 0; j < i; j++) fresh[sorted[j]] = object[sorted[j]];
            fresh[key] = canonical;
          } else {
            values = sorted.slice(0, i).map((earlier) => object[earlier]);
            values.push(canonical);
          }
        }
        length += key.length + 4;
      }
      length += 2;
      if (values) {
        result = new OrderedMembers(sorted, values);
        ordered++;
      } else result = fresh ?? object;
    }
    if (length - start >= PIECE_CHARS || ordered !== orderedBefore) (byHand ??= new Map()).set(result as object, length - start);
    return result;
  };
  const value = walk(root, 1);
  return value === NOT_PLAIN ? undefined : { value, byHand: byHand ?? NONE_BY_HAND };
}

function sameKeys(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function keyOrder(keys: string[]): KeyOrder {
  let inOrder = true;
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i];
    if (!(key as string & { isWellFormed(): boolean }).isWellFormed()) throw new UnrepresentableInputError(LONE_SURROGATE);
    // Compared as JavaScript compares strings: by UTF-16 code units, the canonical order.
    if (i > 0 && keys[i - 1] >= key) inOrder = false;
  }
  const sorted = inOrder ? keys : [...keys].sort();
  // Keys already in order enumerate in that order in a fresh object too (integer-like ones come first either way).
  const copyable = !keys.includes('__proto__') && (inOrder || enumeratesAsSorted(sorted));
  return { keys, sorted, inOrder, copyable };
}
