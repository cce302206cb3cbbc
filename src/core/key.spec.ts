import { describe, expect, it } from '@jest/globals';
import { IdempotencyInputError } from './errors.js';
import { parseIdempotencyKey, unusableIdentifier } from './key.js';
import { redactKey } from './redact-key.js';
import { tenantOrKeyError } from './tenant-or-key-error.js';

describe('parseIdempotencyKey', () => {
  const ok = (values: string[], max = 255) => parseIdempotencyKey(values, max);

  it('returns a bare token exactly as sent', () => {
    expect(ok(['AbC-123_~!'])).toEqual({ ok: true, key: 'AbC-123_~!' });
  });

  it('unquotes an RFC 8941 sf-string and applies its escapes', () => {
    expect(ok(['"abc"'])).toEqual({ ok: true, key: 'abc' });
    expect(ok(['"a\\"b\\\\c"'])).toEqual({ ok: true, key: 'a"b\\c' });
    expect(ok(['"a,b"'])).toEqual({ ok: true, key: 'a,b' });
  });

  it('counts the length after unquoting', () => {
    expect(ok([`"${'x'.repeat(255)}"`])).toEqual({ ok: true, key: 'x'.repeat(255) });
    expect(ok([`"${'x'.repeat(256)}"`])).toMatchObject({ ok: false, reason: 'too-long' });
    expect(ok(['abcdef'], 5)).toMatchObject({ ok: false, reason: 'too-long' });
  });

  it.each([
    [[], 'missing'],
    [['a', 'a'], 'repeated'],
    [[''], 'empty'],
    [['""'], 'empty'],
    [['a,b'], 'malformed'],
    [['"a", "b"'], 'malformed'],
    [['"abc'], 'malformed'],
    [['"abc";p=1'], 'malformed'],
    [['a b'], 'invalid-characters'],
    [['"a b"'], 'invalid-characters'],
    [['caf\u00e9'], 'invalid-characters'],
    [['a\u0000b'], 'invalid-characters'],
  ] as Array<[string[], string]>)('refuses %j as %s', (values, reason) => {
    expect(ok(values)).toMatchObject({ ok: false, reason });
  });

  it('redacts keys for logs', () => {
    expect(redactKey('abcdefghijkl')).toBe('abcd…(12)');
    expect(redactKey('abc')).toBe('****');
  });
});

describe('unusableIdentifier', () => {
  it.each(['t', 'tenant-a', 'ä', '\ufffd', '\ud83d\ude00', ' spaced '])('accepts %j', (value) => {
    expect(unusableIdentifier(value)).toBeUndefined();
  });

  it.each<[unknown, RegExp]>([
    [Buffer.from('tenant-a'), /is an object \(Buffer\), not a string/],
    [42, /is a number, not a string/],
    [undefined, /is undefined, not a string/],
    [null, /is null, not a string/],
    [Object.create(null), /is an object \(without a prototype\), not a string/],
    ['', /is empty/],
    ['a\u0000b', /NUL/],
    ['a\ud800', /lone UTF-16 surrogate/],
    ['\udc00a', /lone UTF-16 surrogate/],
    ['\ude00\ud83d', /lone UTF-16 surrogate/],
  ])('refuses %p', (value, reason) => {
    expect(unusableIdentifier(value)).toMatch(reason);
  });
});

describe('tenantOrKeyError', () => {
  it('names the field at fault, tenant first, and never quotes the value', () => {
    expect(tenantOrKeyError('t', 'k')).toBeUndefined();
    const tenant = tenantOrKeyError('secret\ud800', '');
    expect(tenant).toBeInstanceOf(IdempotencyInputError);
    expect(tenant).toBeInstanceOf(TypeError);
    expect(tenant).toMatchObject({ name: 'IdempotencyInputError', field: 'tenant' });
    expect(tenant?.message).not.toContain('secret');
    expect(tenantOrKeyError('t', 'secret\u0000')).toMatchObject({ field: 'key' });
    expect(tenantOrKeyError('t', 'secret\u0000')?.message).not.toContain('secret');
  });
});
