import type { KeyParseResult } from './key-rejection.js';
import { unquotedKey } from './malformed-key.js';
import { typeName } from './type-name.js';

const VISIBLE_ASCII = /^[\x21-\x7e]+$/;

/**
 * Reads an Idempotency-Key header value: a bare token of visible ASCII without commas, or an RFC 8941 sf-string.
 * The key is returned exactly as sent (after unquoting): never trimmed or case-folded.
 *
 * @param values every occurrence of the header, in order; more than one is a client error even when they agree,
 *   because proxies and clients disagree about which one wins.
 */
export function parseIdempotencyKey(values: readonly string[], maxLength: number): KeyParseResult {
  if (values.length === 0) return { ok: false, reason: 'missing', detail: 'The request has no idempotency key.' };
  if (values.length > 1) {
    return { ok: false, reason: 'repeated', detail: 'The idempotency key header was sent more than once.' };
  }
  const raw = values[0];
  if (raw.length === 0) return { ok: false, reason: 'empty', detail: 'The idempotency key is empty.' };
  const key = raw.startsWith('"') || raw.includes(',') ? unquotedKey(raw) : raw;
  if (typeof key !== 'string') return key;
  return checkKey(key, maxLength);
}

/**
 * The key rules every transport applies, to a header's value once unquoted and to a key read from a message or
 * an argument as it is: not empty, at most `maxLength` characters, visible ASCII only.
 */
export function checkKey(key: string, maxLength: number): KeyParseResult {
  if (key.length === 0) return { ok: false, reason: 'empty', detail: 'The idempotency key is empty.' };
  if (key.length > maxLength) {
    return { ok: false, reason: 'too-long', detail: `The idempotency key is longer than ${maxLength} characters.` };
  }
  if (!VISIBLE_ASCII.test(key)) {
    return {
      ok: false,
      reason: 'invalid-characters',
      detail: 'The idempotency key may only contain visible ASCII characters (0x21-0x7E).',
    };
  }
  return { ok: true, key };
}

/** A UTF-16 surrogate outside a pair: with the `u` flag a pair is one code point, so only a lone one is in Cs. */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Why `value` cannot be a tenant or a key, or undefined when it can: only a non-empty string that PostgreSQL text
 * holds as it is (UTF-8 turns a lone surrogate into U+FFFD, so two keys would meet in the database but not here;
 * text cannot hold a NUL). Nothing is converted, so no Buffer becomes another tenant's text. Never quotes the value.
 */
export function unusableIdentifier(value: unknown): string | undefined {
  if (typeof value !== 'string') return `is ${typeName(value)}, not a string`;
  if (value === '') return 'is empty';
  if (value.includes('\0')) return 'contains a NUL character (U+0000), which PostgreSQL text cannot hold';
  if (LONE_SURROGATE.test(value)) return 'contains a lone UTF-16 surrogate, which UTF-8 cannot encode';
  return undefined;
}
