import { describe, expect, it } from '@jest/globals';
import { businessKey, businessKeyWithin, deriveKey } from './derived-keys.js';

describe('deriveKey', () => {
  const scope = { tenant: 'acct_1', key: 'order-7f3a-jane.doe@example.com' };

  it('is deterministic for the same tenant, key and purpose', () => {
    expect(deriveKey(scope, 'charge')).toBe(deriveKey({ ...scope }, 'charge'));
  });

  it('differs by purpose, tenant and key', () => {
    const base = deriveKey(scope, 'charge');
    expect(deriveKey(scope, 'refund')).not.toBe(base);
    expect(deriveKey({ ...scope, tenant: 'acct_2' }, 'charge')).not.toBe(base);
    expect(deriveKey({ ...scope, key: `${scope.key}x` }, 'charge')).not.toBe(base);
    // Field boundaries matter: moving a character between fields is another key.
    expect(deriveKey({ tenant: 'ab', key: 'c' }, 'p')).not.toBe(deriveKey({ tenant: 'a', key: 'bc' }, 'p'));
  });

  it('differs by generation (one use of a key), and with a generation never equals the key without one', () => {
    const scope = { tenant: 'acme', key: 'order-1' };
    const first = deriveKey({ ...scope, generation: 'g1' }, 'charge');
    expect(deriveKey({ ...scope, generation: 'g1' }, 'charge')).toBe(first);
    expect(deriveKey({ ...scope, generation: 'g2' }, 'charge')).not.toBe(first);
    expect(deriveKey(scope, 'charge')).not.toBe(first);
  });

  it('fits the downstream limit and keeps at least 128 bits', () => {
    for (const maxLength of [22, 32, 64, 255]) {
      const derived = deriveKey(scope, 'a-rather-long-purpose-name', { maxLength });
      expect(derived.length).toBeLessThanOrEqual(maxLength);
      expect(derived).toMatch(/^[A-Za-z0-9_-]+$/);
    }
    expect(deriveKey(scope, 'charge', { maxLength: 64 })).toMatch(/^charge_[A-Za-z0-9_-]{43}$/);
    expect(() => deriveKey(scope, 'charge', { maxLength: 16 })).toThrow(RangeError);
  });

  it('carries no part of the original key', () => {
    const derived = deriveKey(scope, 'charge', { maxLength: 255 });
    expect(derived).not.toContain('jane');
    expect(derived).not.toContain('example');
    expect(derived).not.toContain('acct');
  });

  it('changes with the secret', () => {
    expect(deriveKey(scope, 'charge', { secret: 's1' })).not.toBe(deriveKey(scope, 'charge', { secret: 's2' }));
    expect(deriveKey(scope, 'charge', { secret: 's1' })).not.toBe(deriveKey(scope, 'charge'));
  });
});

describe('businessKey', () => {
  it('joins business identity into a readable, stable key', () => {
    expect(businessKey('order', 1042, 'capture')).toBe('order:1042:capture');
  });

  it('escapes separators so different identities never collide', () => {
    expect(businessKey('a:b', 'c')).not.toBe(businessKey('a', 'b:c'));
    expect(businessKey('a%3Ab')).not.toBe(businessKey('a:b'));
  });

  it('bounds the length with a hash of the whole', () => {
    const long = businessKeyWithin(64, 'invoice', 'x'.repeat(200), 'send');
    expect(long.length).toBe(64);
    expect(long).not.toBe(businessKeyWithin(64, 'invoice', `${'x'.repeat(199)}y`, 'send'));
  });

  it('refuses characters an idempotency key may not carry', () => {
    expect(() => businessKey('order', 'with space')).toThrow(RangeError);
  });
});
