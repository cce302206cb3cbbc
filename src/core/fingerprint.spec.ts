import { describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { UnrepresentableInputError } from './errors.js';
import type { FingerprintInput } from './fingerprint-input.js';
import { fingerprintValue } from './fingerprint-value.js';
import { canonicalJson, fingerprintRequest, MAX_FINGERPRINT_DEPTH } from './fingerprint.js';

const request = (overrides: Partial<FingerprintInput> = {}): FingerprintInput => ({
  method: 'POST',
  route: '/charges',
  params: {},
  query: {},
  body: { amount: 1, nested: { b: [1, { y: 2, x: 1 }], a: null } },
  ...overrides,
});

function nested(depth: number): unknown {
  let value: unknown = 1;
  for (let i = 0; i < depth; i++) value = [value];
  return value;
}

describe('fingerprintRequest', () => {
  it('ignores key order at every depth, in the body and in the query', () => {
    const reordered = request({ method: 'post', body: { nested: { a: null, b: [1, { x: 1, y: 2 }] }, amount: 1 } });
    expect(fingerprintRequest(reordered)).toBe(fingerprintRequest(request()));
    expect(fingerprintRequest(request({ query: { b: '2', a: '1' } }))).toBe(
      fingerprintRequest(request({ query: { a: '1', b: '2' } })),
    );
  });

  it('is a SHA-256 hex digest', () => {
    expect(fingerprintRequest(request())).toMatch(/^[0-9a-f]{64}$/);
  });

  it('changes with the method, the route, a parameter, the query, a value, or array order', () => {
    const f = fingerprintRequest(request());
    const body = request().body as { amount: number; nested: unknown };
    expect(fingerprintRequest(request({ method: 'PUT' }))).not.toBe(f);
    expect(fingerprintRequest(request({ route: '/refunds' }))).not.toBe(f);
    expect(fingerprintRequest(request({ params: { id: '1' } }))).not.toBe(fingerprintRequest(request({ params: { id: '2' } })));
    expect(fingerprintRequest(request({ query: { x: '1' } }))).not.toBe(f);
    expect(fingerprintRequest(request({ body: { ...body, amount: 2 } }))).not.toBe(f);
    expect(fingerprintRequest(request({ body: { ...body, nested: { a: null, b: [{ y: 2, x: 1 }, 1] } } }))).not.toBe(f);
  });

  it('treats an absent query like an empty one', () => {
    expect(fingerprintRequest(request({ query: undefined }))).toBe(fingerprintRequest(request({ query: {} })));
  });

  it('tells a text body from a JSON body of the same text, and from bytes', () => {
    const json = fingerprintRequest(request({ body: 'abc' }));
    const bytes = fingerprintRequest(request({ body: Buffer.from('abc') }));
    const object = fingerprintRequest(request({ body: ['abc'] }));
    expect(new Set([json, bytes, object]).size).toBe(3);
  });

  it('treats a missing body and a null body alike', () => {
    expect(fingerprintRequest(request({ body: undefined }))).toBe(fingerprintRequest(request({ body: null })));
  });

  it('refuses what canonical JSON cannot hold, with a reason', () => {
    const reasons = [{ text: '\ud800' }, { n: Infinity }, nested(MAX_FINGERPRINT_DEPTH + 1), nested(5_000)].map((body) => {
      try {
        fingerprintRequest(request({ body }));
        return 'accepted';
      } catch (error) {
        expect(error).toBeInstanceOf(UnrepresentableInputError);
        return (error as UnrepresentableInputError).reason;
      }
    });
    expect(reasons[0]).toMatch(/lone surrogate/);
    expect(reasons[1]).toMatch(/out of range/);
    expect(reasons[2]).toMatch(/nested deeper than 128/);
    expect(reasons[3]).toMatch(/nested deeper than 128/);
    expect(() => fingerprintRequest(request({ body: nested(MAX_FINGERPRINT_DEPTH) }))).not.toThrow();
  });
});

describe('fingerprintValue', () => {
  it('fingerprints plain values canonically', () => {
    expect(fingerprintValue({ b: 1, a: 2 })).toBe(fingerprintValue({ a: 2, b: 1 }));
    expect(fingerprintValue({ a: 1 })).not.toBe(fingerprintValue({ a: '1' }));
  });
});

describe('canonicalJson', () => {
  it('writes exactly what the canonicalize package (RFC 8785) writes, and refuses what it refuses', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6, stringUnit: 'binary' }), (value) => {
        let expected: string | undefined;
        let refused = false;
        try {
          expected = canonicalize(value);
        } catch {
          refused = true;
        }
        if (refused) expect(() => canonicalJson(value)).toThrow(UnrepresentableInputError);
        else expect(canonicalJson(value)).toBe(expected);
      }),
      { numRuns: 2_000 },
    );
  });

  it('writes the same through its fast path (plain JSON data) and its general writer (anything else)', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 5, stringUnit: 'binary' }), (value) => {
        let plain: string | undefined;
        try {
          plain = canonicalJson(value);
        } catch (error) {
          // Refused the same way when the value sits under something only the general writer takes.
          expect(() => canonicalJson([new Date(0), value])).toThrow(UnrepresentableInputError);
          expect(error).toBeInstanceOf(UnrepresentableInputError);
          return;
        }
        // A Date (it has toJSON) sends the whole value through the general writer.
        expect(canonicalJson([new Date(0), value])).toBe(`["1970-01-01T00:00:00.000Z",${plain}]`);
      }),
      { numRuns: 1_000 },
    );
  });

  it('takes what a JSON parser can make that the fast path must not read through a prototype: an own __proto__ key', () => {
    const parsed = JSON.parse('{"b":{"__proto__":{"x":1},"a":2},"c":{}}') as unknown;
    expect(canonicalJson(parsed)).toBe(canonicalize(parsed));
    expect(canonicalJson(parsed)).toBe('{"b":{"__proto__":{"x":1},"a":2},"c":{}}');
  });

  it('takes many objects with distinct keys (where a property list would cost objects x keys) through the general writer', () => {
    const many = Array.from({ length: 2_000 }, (_, i) => ({ [`k${i}`]: i, shared: true }));
    expect(canonicalJson(many)).toBe(canonicalize(many));
  });

  it('writes objects whose keys are already in order (the plain serializer, no property list) as canonicalize does', () => {
    const sortedKeys = fc.dictionary(fc.string({ unit: 'binary' }), fc.jsonValue({ maxDepth: 2, stringUnit: 'binary' }), {
      maxKeys: 6,
    });
    fc.assert(
      fc.property(sortedKeys, (record) => {
        // Inserted in sorted order: Object.keys is that order unless integer-like keys come first, which the check sees.
        const value = Object.fromEntries(Object.entries(record).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
        let expected: string | undefined;
        try {
          expected = canonicalize(value);
        } catch {
          expect(() => canonicalJson(value)).toThrow(UnrepresentableInputError);
          return;
        }
        expect(canonicalJson(value)).toBe(expected);
      }),
      { numRuns: 2_000 },
    );
    // Integer-like keys enumerate first and numerically: 2 before 10, which is not the canonical order.
    expect(canonicalJson({ 2: 'b', 10: 'a', x: { a: 1, b: 2 } })).toBe('{"10":"a","2":"b","x":{"a":1,"b":2}}');
    expect(canonicalJson({ 10: 'a', x: { b: 1, a: 2 } })).toBe('{"10":"a","x":{"a":2,"b":1}}');
  });

  it('sorts keys by UTF-16 code units, integer-like keys included', () => {
    expect(canonicalJson({ b: 1, 10: 2, 2: 3, a: [undefined, { y: null, x: true }], '\u00e9': 0, z: undefined })).toBe(
      '{"10":2,"2":3,"a":[null,{"x":true,"y":null}],"b":1,"\u00e9":0}',
    );
  });
});

describe('canonicalJson and fingerprints of large values (written in pieces, objects re-sorted into fresh ones)', () => {
  /** What the fingerprint of a JSON value was before it was written in pieces: SHA-256 of "json:" and the RFC 8785 text. */
  const expectedFingerprint = (value: unknown) =>
    createHash('sha256')
      .update(`json:${canonicalize(value) as string}`)
      .digest('hex');

  const expectCanonical = (value: unknown) => {
    const before = JSON.stringify(value);
    const expected = canonicalize(value);
    // Compared by digest: a failure should not print a megabyte.
    const digest = (text: string | undefined) => createHash('sha256').update(String(text)).digest('hex');
    expect(digest(canonicalJson(value))).toBe(digest(expected));
    expect(fingerprintValue(value)).toBe(expectedFingerprint(value));
    // Sorted into copies: the value itself is left as it was.
    expect(JSON.stringify(value)).toBe(before);
  };

  it('writes random large values as canonicalize does, and hashes them as before', () => {
    const member = fc.jsonValue({ maxDepth: 3, stringUnit: 'binary' });
    const large = fc.record({
      z: fc.array(member, { minLength: 200, maxLength: 1_500 }),
      a: fc.dictionary(fc.string({ unit: 'binary' }), fc.array(member, { maxLength: 200 }), { maxKeys: 20 }),
      '10': fc.array(fc.dictionary(fc.string({ maxLength: 3 }), member, { maxKeys: 8 }), { maxLength: 500 }),
    });
    fc.assert(
      fc.property(large, (value) => {
        let refused = false;
        try {
          canonicalize(value);
        } catch {
          refused = true;
        }
        if (refused) expect(() => canonicalJson(value)).toThrow(UnrepresentableInputError);
        else expectCanonical(value);
      }),
      { numRuns: 60 },
    );
  });

  it('writes a ~1 MiB body of line items with keys out of order, as the bench sends it', () => {
    const lines = Array.from({ length: 8_000 }, (_, i) => ({
      sku: `sku-${i}`,
      description: `Line item ${i} \u{1F600} caf\u00e9`,
      quantity: 1 + (i % 5),
      unitAmount: i % 3 ? 100.5 + i : -0,
      tags: ['bench', i % 2 ? 'odd' : 'even', { z: null, y: [true, false] }],
    }));
    const body = { metadata: { order: 'ord', lines }, amount: 1, currency: 'eur' };
    expect(Buffer.byteLength(JSON.stringify(body))).toBeGreaterThan(900_000);
    expectCanonical(body);
    expectCanonical(JSON.parse(JSON.stringify(body)));
  });

  it('writes integer-like keys in canonical order wherever they are, in small and large objects', () => {
    const small = { b: 1, 10: 2, 9: 3, a: { 2: 'x', 10: 'y', '-1': 'z', ' ': 0 }, '007': 1, 4294967296: 5, 4294967294: 6 };
    expectCanonical(small);
    expectCanonical([small, { 1: { b: 1, a: 2 }, 0: [] }]);
    const large = Object.fromEntries(Array.from({ length: 3_000 }, (_, i) => [String((i * 7919) % 3_001), { v: i, k: 'x' }]));
    expectCanonical(large);
    expectCanonical({ b: large, a: Array.from({ length: 300 }, (_, i) => ({ [i]: i, [`k${i}`]: i, 1: 'one', 10: 'ten' })) });
  });

  it('writes own __proto__ keys (a JSON parser makes them) in small objects, large ones and large arrays', () => {
    const items = Array.from({ length: 2_000 }, (_, i) => `{"b":${i},"__proto__":{"y":1,"x":[${i}]},"a":"${'x'.repeat(i % 7)}"}`);
    for (const text of [
      '{"b":1,"__proto__":{"y":1,"x":2},"a":2}',
      '{"a":{"__proto__":1},"b":{"d":1,"c":2}}',
      `[${items.join(',')}]`,
      `{"z":[${items.join(',')}],"__proto__":[${items.slice(0, 50).join(',')}]}`,
    ]) {
      const parsed = JSON.parse(text) as unknown;
      expectCanonical(parsed);
      expect(Object.getPrototypeOf(parsed)).toBe(Array.isArray(parsed) ? Array.prototype : Object.prototype);
    }
  });

  it('writes large arrays of objects that share no keys, and members with no JSON form as JSON.stringify does', () => {
    expectCanonical(Array.from({ length: 20_000 }, (_, i) => ({ [`k${i}`]: i, shared: [i, undefined], gone: undefined })));
    // canonicalize writes a function as `undefined` in an object and as nothing in an array (`[1,]`); this leaves
    // it out of an object and writes null in an array, as JSON.stringify does (and as the general writer always did).
    const functions = Array.from({ length: 5_000 }, (_, i) => [i, () => i, Symbol('s'), { f: () => i, b: 1 }]);
    expect(canonicalJson(functions)).toBe(JSON.stringify(functions));
    expectCanonical({
      z: Array.from({ length: 5_000 }, (_, i) => (i % 3 ? undefined : { b: i, a: Symbol('s') })),
      a: 'x'.repeat(20_000),
    });
  });

  it('refuses hostile input hidden deep in a large value', () => {
    const filler = Array.from({ length: 5_000 }, (_, i) => ({ b: i, a: 'filler' }));
    const deep = (depth: number): unknown => {
      let value: unknown = { b: 1, a: 2 };
      for (let i = 1; i < depth; i++) value = i % 2 ? [value] : { y: value, x: 1 };
      return value;
    };
    const refusal = (value: unknown) => {
      try {
        fingerprintValue(value);
        return 'accepted';
      } catch (error) {
        expect(error).toBeInstanceOf(UnrepresentableInputError);
        return (error as UnrepresentableInputError).reason;
      }
    };
    expect(refusal([...filler, { b: 'ok', a: 'lone \ud800 half' }])).toMatch(/lone surrogate/);
    expect(refusal([...filler, { ['\udc00']: 1 }])).toMatch(/lone surrogate/);
    expect(refusal({ z: filler, a: [1, Number.NaN] })).toMatch(/out of range/);
    expect(refusal({ z: filler, a: [1, 10n] })).toMatch(/BigInt/);
    expect(refusal([...filler, deep(MAX_FINGERPRINT_DEPTH)])).toMatch(/nested deeper than 128/);
    expect(refusal([...filler, deep(MAX_FINGERPRINT_DEPTH - 1)])).toBe('accepted');
    expectCanonical([...filler, deep(MAX_FINGERPRINT_DEPTH - 1)]);
  });

  it('takes values that are not plain data in a large value through the general writer', () => {
    class Amount {
      constructor(readonly value = 1) {}
    }
    const filler = Array.from({ length: 3_000 }, (_, i) => ({ b: i, a: 'filler' }));
    const withToJson = Object.assign([1, 2], { toJSON: () => 'two numbers' });
    for (const odd of [new Date(0), new Amount(), withToJson, new Map([[1, 2]]), Object(5) as unknown]) {
      const value = { z: filler, a: odd };
      expect(canonicalJson(value)).toBe(canonicalize(value));
    }
  });
});
