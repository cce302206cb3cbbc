import { describe, expect, it } from '@jest/globals';
import { fingerprintRequest, fingerprintValue } from './fingerprint.js';

describe('fingerprintRequest', () => {
  const base = { method: 'POST', path: '/charges', body: { amount: 1, nested: { b: [1, { y: 2, x: 1 }], a: null } } };

  it('ignores key order at every depth', () => {
    const reordered = { method: 'post', path: '/charges', body: { nested: { a: null, b: [1, { x: 1, y: 2 }] }, amount: 1 } };
    expect(fingerprintRequest(reordered)).toBe(fingerprintRequest(base));
  });

  it('is a SHA-256 hex digest', () => {
    expect(fingerprintRequest(base)).toMatch(/^[0-9a-f]{64}$/);
  });

  it('changes with the method, the path, a value, or array order', () => {
    const f = fingerprintRequest(base);
    expect(fingerprintRequest({ ...base, method: 'PUT' })).not.toBe(f);
    expect(fingerprintRequest({ ...base, path: '/charges?x=1' })).not.toBe(f);
    expect(fingerprintRequest({ ...base, body: { ...base.body, amount: 2 } })).not.toBe(f);
    expect(fingerprintRequest({ ...base, body: { ...base.body, nested: { a: null, b: [{ y: 2, x: 1 }, 1] } } })).not.toBe(f);
  });

  it('tells a text body from a JSON body of the same text, and from bytes', () => {
    const json = fingerprintRequest({ method: 'POST', path: '/', body: 'abc' });
    const bytes = fingerprintRequest({ method: 'POST', path: '/', body: Buffer.from('abc') });
    const object = fingerprintRequest({ method: 'POST', path: '/', body: ['abc'] });
    expect(new Set([json, bytes, object]).size).toBe(3);
  });

  it('treats a missing body and a null body alike', () => {
    expect(fingerprintRequest({ method: 'POST', path: '/', body: undefined })).toBe(
      fingerprintRequest({ method: 'POST', path: '/', body: null }),
    );
  });

  it('fingerprints plain values canonically', () => {
    expect(fingerprintValue({ b: 1, a: 2 })).toBe(fingerprintValue({ a: 2, b: 1 }));
    expect(fingerprintValue({ a: 1 })).not.toBe(fingerprintValue({ a: '1' }));
  });
});
