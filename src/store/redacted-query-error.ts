/**
 * A failed statement of the module, its error without the statement's parameters (keys, tenants, bodies): for the
 * error a caller gets and the one TypeORM's logger sees (see redacting-logger.ts).
 */

/** What stands in for a parameter of the module's SQL in logs and on errors. */
export const REDACTED = '[redacted]';

/** Fields of a pg error that can quote row values (`Key (tenant_id, key)=(t, abc) already exists.`). */
const VALUE_BEARING_FIELDS = ['detail', 'where', 'internalQuery'] as const;

/** Shorter parameter values are not scrubbed from messages: they would match ordinary words. */
const MIN_SCRUBBED_LENGTH = 4;

/**
 * Removes the parameters of one of the module's statements from an error
 * raised by it, in place, and returns the error. The parameters are keys,
 * tenants and stored bodies; TypeORM's `QueryFailedError` carries them
 * (`parameters`) and copies pg's `detail` onto itself, and Nest's exception
 * logging prints the whole object. The SQL text (the module's own), the
 * SQLSTATE `code` and the message are kept, so unavailability is still
 * recognised; a parameter value quoted in a server message is cut out of it.
 */
export function redactQueryError<E>(error: E, params: readonly unknown[] = []): E {
  const secrets = params
    .map((p) => (Buffer.isBuffer(p) ? p.toString('utf8') : p))
    .filter((p): p is string => typeof p === 'string' && p.length >= MIN_SCRUBBED_LENGTH)
    // Longest first, so a value containing another is cut out whole.
    .sort((a, b) => b.length - a.length);
  const seen = new Set<object>();
  for (let current: unknown = error; current && typeof current === 'object' && !seen.has(current);) {
    seen.add(current);
    const target = current as Record<string, unknown>;
    if (Array.isArray(target.parameters)) target.parameters = target.parameters.map(() => REDACTED);
    for (const field of VALUE_BEARING_FIELDS) if (target[field] !== undefined) target[field] = REDACTED;
    // Only the server's own messages (those with a SQLSTATE) can quote a value; a driver's connection message cannot.
    if (secrets.length > 0 && typeof target.code === 'string' && /^[0-9A-Z]{5}$/.test(target.code)) {
      for (const field of ['message', 'stack'] as const) {
        if (typeof target[field] === 'string') target[field] = scrub(target[field] as string, secrets);
      }
    }
    current = target.driverError ?? target.cause;
  }
  return error;
}

function scrub(text: string, secrets: readonly string[]): string {
  let result = text;
  for (const secret of secrets) result = result.split(secret).join(REDACTED);
  return result;
}
