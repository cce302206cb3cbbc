import { describe, expect, it } from '@jest/globals';
import { ProblemType } from '../src/index.js';
import { send } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { useApiSuite } from './support/suite.js';

describe.each(ADAPTERS)('the Idempotency-Key header over %s (CONTRACT A1)', (adapter) => {
  const t = useApiSuite(adapter, 'keys');

  const withKeyHeaders = (label: string, keyHeaders: Array<[string, string]>) =>
    send(t.api.url, 'POST', '/items', { headers: [['X-Tenant', 'tenant-a'], ...keyHeaders], body: { label } });

  const rejected: Array<[string, Array<[string, string]>]> = [
    ['an empty value', [['Idempotency-Key', '']]],
    ['a key of 256 characters', [['Idempotency-Key', 'k'.repeat(256)]]],
    ['a quoted key of 256 characters', [['Idempotency-Key', `"${'q'.repeat(256)}"`]]],
    ['a space inside', [['Idempotency-Key', 'two words']]],
    ['a non-ASCII character', [['Idempotency-Key', 'caf\u00e9']]],
    ['a comma-joined list', [['Idempotency-Key', 'abc,def']]],
    ['a list of sf-strings', [['Idempotency-Key', '"abc", "def"']]],
    [
      'the header sent twice',
      [
        ['Idempotency-Key', 'same'],
        ['Idempotency-Key', 'same'],
      ],
    ],
    ['an unterminated sf-string', [['Idempotency-Key', '"abc']]],
    ['an sf-string with parameters', [['Idempotency-Key', '"abc";v=1']]],
    ['an empty sf-string', [['Idempotency-Key', '""']]],
    ['an sf-string holding a space', [['Idempotency-Key', '"a b"']]],
    ['a tab inside', [['Idempotency-Key', 'a\tb']]],
  ];

  it.each(rejected)('rejects %s with a 400 problem and runs nothing', async (_name, headers) => {
    const label = t.fresh();
    const res = await withKeyHeaders(label, headers);
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.json()).toMatchObject({
      type: ProblemType.invalidKey,
      status: 400,
      title: expect.any(String),
      detail: expect.any(String),
    });
    expect(t.api.probe.count(label)).toBe(0);
  });

  it('accepts a key of exactly 255 visible ASCII characters', async () => {
    const label = t.fresh();
    const key = `${'!~'.repeat(100)}${label}`.padEnd(255, 'z').slice(0, 255);
    const res = await withKeyHeaders(label, [['Idempotency-Key', key]]);
    expect(res.status).toBe(201);
    const stored = await t.db.query('SELECT key FROM idempotency_keys WHERE key = $1', [key]);
    expect(stored.rowCount).toBe(1);
  });

  it('treats the sf-string "abc" as the bare key abc', async () => {
    const label = t.fresh();
    const bare = await withKeyHeaders(label, [['Idempotency-Key', `k${label}`]]);
    const quoted = await withKeyHeaders(label, [['Idempotency-Key', `"k${label}"`]]);
    expect(bare.status).toBe(201);
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(t.api.probe.count(label)).toBe(1);
  });

  it('applies sf-string escapes and keeps the key unnormalised', async () => {
    const label = t.fresh();
    const res = await withKeyHeaders(label, [['Idempotency-Key', `"a\\"b\\\\c-${label}"`]]);
    expect(res.status).toBe(201);
    const stored = await t.db.query('SELECT key FROM idempotency_keys WHERE key = $1', [`a"b\\c-${label}`]);
    expect(stored.rowCount).toBe(1);
  });

  it('reads the header name case-insensitively', async () => {
    const label = t.fresh();
    const res = await withKeyHeaders(label, [['IDEMPOTENCY-KEY', `k-${label}`]]);
    expect(res.status).toBe(201);
    const again = await withKeyHeaders(label, [['idempotency-key', `k-${label}`]]);
    expect(again.headers['idempotent-replayed']).toBe('true');
  });
});
