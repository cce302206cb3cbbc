import { parseItem } from 'structured-headers';
import type { KeyParseResult } from './key-rejection.js';

/** A key header value that is quoted, or holds a comma: the key an RFC 8941 sf-string holds, or why it is malformed. */
export function unquotedKey(raw: string): string | KeyParseResult {
  if (raw.startsWith('"')) {
    const unquoted = parseSfString(raw);
    if (unquoted === undefined) {
      return {
        ok: false,
        reason: 'malformed',
        detail: 'The idempotency key starts with a quote but is not a single RFC 8941 string without parameters.',
      };
    }
    return unquoted;
  }
  return {
    ok: false,
    reason: 'malformed',
    detail: 'The idempotency key contains a comma: send one key, or quote it as an RFC 8941 string.',
  };
}

function parseSfString(raw: string): string | undefined {
  try {
    const [value, params] = parseItem(raw);
    if (typeof value !== 'string' || params.size > 0) return undefined;
    return value;
  } catch {
    return undefined;
  }
}
