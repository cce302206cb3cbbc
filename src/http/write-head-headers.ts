import type { OutgoingHttpHeaders } from 'node:http';

/**
 * The headers given to a held `writeHead(status, [message], [headers])` call
 * by lower-case name, each with its name as given and its value, a header
 * given several times as one array of its values (never joined).
 */
export function headerEntries(call: unknown[] | undefined): Map<string, [string, string | string[]]> {
  const entries = new Map<string, [string, string | string[]]>();
  if (!call) return entries;
  const headers = (typeof call[1] === 'string' ? call[2] : call[1]) as OutgoingHttpHeaders | unknown[] | undefined;
  if (!headers) return entries;
  const add = (name: unknown, value: unknown) => {
    if (value === undefined) return;
    const lower = String(name).toLowerCase();
    const values = (Array.isArray(value) ? value : [value]).map(String);
    const current = entries.get(lower);
    const merged = current === undefined ? values : [...(Array.isArray(current[1]) ? current[1] : [current[1]]), ...values];
    entries.set(lower, [current?.[0] ?? String(name), merged.length === 1 ? merged[0] : merged]);
  };
  if (Array.isArray(headers)) {
    // Either [[name, value], ...] or a flat [name, value, name, value].
    if (headers.every((entry) => Array.isArray(entry))) {
      for (const [name, value] of headers as Array<[unknown, unknown]>) add(name, value);
    } else {
      for (let i = 0; i + 1 < headers.length; i += 2) add(headers[i], headers[i + 1]);
    }
    return entries;
  }
  for (const [name, value] of Object.entries(headers)) add(name, value);
  return entries;
}
