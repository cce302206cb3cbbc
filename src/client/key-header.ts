import { clientMessages } from './messages.js';

const VISIBLE_ASCII = /^[\x21-\x7e]+$/;

/**
 * The header value that carries `key`. The server reads a bare value with a
 * comma as a list and one opening with a quote as an RFC 8941 sf-string, so
 * such keys (a `businessKey` part may hold a comma) go out as an sf-string,
 * which the server unquotes to the same key.
 *
 * @throws RangeError for a key the server could never accept
 */
export function keyHeaderValue(key: string): string {
  if (typeof key !== 'string' || !VISIBLE_ASCII.test(key)) throw new RangeError(clientMessages.invalidKey);
  return key.includes(',') || key.startsWith('"') ? `"${key.replace(/[\\"]/g, '\\$&')}"` : key;
}
