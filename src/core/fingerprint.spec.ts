import { describe, expect, it } from '@jest/globals';
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { UnrepresentableInputError } from './errors.js';
import {
  canonicalJson,
  fingerprintRequest,
  fingerprintValue,
  MAX_FINGERPRINT_DEPTH,
  type FingerprintInput,
} from './fingerprint.js';

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
