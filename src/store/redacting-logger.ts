import type { DataSource, Logger as TypeOrmLogger, QueryRunner } from 'typeorm';

/**
 * Every statement of the module starts with this comment. It lets the
 * redaction below tell the module's SQL from the application's, and it
 * names the statement in `pg_stat_statements` and `pg_stat_activity`.
 */
export const MODULE_SQL_MARKER = '/* nest-idempotency:';

/** What stands in for a parameter of the module's SQL in logs and on errors. */
export const REDACTED = '[redacted]';

/** The marker comment that opens the module's statement `name` (e.g. `sqlMarker('claim')`). */
export function sqlMarker(name: string): string {
  return `${MODULE_SQL_MARKER}${name} */`;
}

export function isModuleSql(sql: unknown): boolean {
  return typeof sql === 'string' && sql.trimStart().startsWith(MODULE_SQL_MARKER);
}

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

function redactParameters<P>(sql: string, parameters: P): P {
  if (!isModuleSql(sql) || !Array.isArray(parameters)) return parameters;
  return parameters.map(() => REDACTED) as P;
}

/** Marks loggers this module made, so wrapping is done once per logger. */
const WRAPPED = Symbol('nest-idempotency:redacting-logger');

/**
 * Wraps a TypeORM logger so that the parameters of the module's statements
 * never reach it (query, slow-query and query-error logging), while the
 * application's own queries are logged exactly as before.
 */
export function redactingLogger(inner: TypeOrmLogger): TypeOrmLogger {
  if ((inner as { [WRAPPED]?: true })[WRAPPED]) return inner;
  const wrapper: TypeOrmLogger & { [WRAPPED]: true } = {
    [WRAPPED]: true,
    logQuery: (query: string, parameters?: unknown, queryRunner?: QueryRunner) =>
      inner.logQuery(query, redactParameters(query, parameters) as any[] | undefined, queryRunner),
    logQueryError: (error: string | Error, query: string, parameters?: unknown, queryRunner?: QueryRunner) => {
      // Redacted in place: TypeORM builds its QueryFailedError from this same driver error right after.
      if (isModuleSql(query) && typeof error === 'object') redactQueryError(error, Array.isArray(parameters) ? parameters : []);
      return inner.logQueryError(error, query, redactParameters(query, parameters) as any[] | undefined, queryRunner);
    },
    logQuerySlow: (time: number, query: string, parameters?: unknown, queryRunner?: QueryRunner) =>
      inner.logQuerySlow(time, query, redactParameters(query, parameters) as any[] | undefined, queryRunner),
    logSchemaBuild: (message: string, queryRunner?: QueryRunner) => inner.logSchemaBuild(message, queryRunner),
    logMigration: (message: string, queryRunner?: QueryRunner) => inner.logMigration(message, queryRunner),
    log: (level: 'log' | 'info' | 'warn', message: unknown, queryRunner?: QueryRunner) => inner.log(level, message, queryRunner),
  };
  return wrapper;
}

/** Data sources whose logger is already guarded. */
const guarded = new WeakSet<DataSource>();

/**
 * Puts the redacting wrapper around `dataSource.logger`, now and whenever it
 * is replaced later (`setOptions({ logger })` assigns a new one). Safe to call
 * any number of times.
 */
export function installRedactingLogger(dataSource: DataSource): void {
  if (guarded.has(dataSource)) return;
  guarded.add(dataSource);
  let current = redactingLogger(dataSource.logger);
  Object.defineProperty(dataSource, 'logger', {
    configurable: true,
    enumerable: true,
    get: () => current,
    set: (next: TypeOrmLogger) => {
      current = redactingLogger(next);
    },
  });
}

/** DI token of the provider that guards the module's data source logger at start-up. */
export const QUERY_LOG_REDACTION = Symbol('nest-idempotency:query-log-redaction');
