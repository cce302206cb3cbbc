import { parseItem } from 'structured-headers';

/** The text of a header value that is one RFC 8941 sf-string without parameters, else undefined. */
export function parseSfString(raw: string): string | undefined {
  try {
    const [value, params] = parseItem(raw);
    if (typeof value !== 'string' || params.size > 0) return undefined;
    return value;
  } catch {
    return undefined;
  }
}
