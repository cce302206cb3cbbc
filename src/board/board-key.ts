import { createHash } from 'node:crypto';

/**
 * A key as the board lists it: its first and last characters (up to four
 * each, never more than a third of the key each), its length, and a tag of
 * six hex digits from its SHA-256. Two keys that differ anywhere read apart
 * (`e…1 (5) #…` and `e…2 (5) #…`, and keys alike at both ends by their tags),
 * while the middle of a long, secret-looking key is never shown. The same key
 * reads the same in every list, in the lookup and on every instance.
 */
export function boardKey(key: string): string {
  const characters = Array.from(key);
  const shown = Math.min(4, Math.floor(characters.length / 3));
  const start = characters.slice(0, shown).join('');
  const end = shown > 0 ? characters.slice(-shown).join('') : '';
  const tag = createHash('sha256').update(key, 'utf8').digest('hex').slice(0, 6);
  return `${start}…${end} (${characters.length}) #${tag}`;
}
