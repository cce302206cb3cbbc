import type { SourceDataSource, StatementLogger } from './connection.js';
import { REDACTED, redactQueryError } from './redacted-query-error.js';
import { MODULE_SQL_MARKER } from './sql-marker.js';

/** Whether `sql` is one of the module's statements. */
export function isModuleSql(sql: unknown): boolean {
  return typeof sql === 'string' && sql.trimStart().startsWith(MODULE_SQL_MARKER);
}

function redactParameters<P>(sql: string, parameters: P): P {
  if (!isModuleSql(sql) || !Array.isArray(parameters)) return parameters;
  return parameters.map(() => REDACTED) as P;
}

/** Marks loggers this module made, so wrapping is done once per logger. */
const WRAPPED = Symbol('nest-idempotency:redacting-logger');

/** Wraps a TypeORM logger so the module's statements' parameters never reach it; the app's are logged as before. */
export function redactingLogger(inner: StatementLogger): StatementLogger {
  if ((inner as { [WRAPPED]?: true })[WRAPPED]) return inner;
  const wrapper: StatementLogger & { [WRAPPED]: true } = {
    [WRAPPED]: true,
    logQuery: (query: string, parameters?: unknown, queryRunner?: unknown) =>
      inner.logQuery(query, redactParameters(query, parameters) as any[] | undefined, queryRunner),
    logQueryError: (error: string | Error, query: string, parameters?: unknown, queryRunner?: unknown) => {
      // Redacted in place: TypeORM builds its QueryFailedError from this same driver error right after.
      if (isModuleSql(query) && typeof error === 'object') redactQueryError(error, Array.isArray(parameters) ? parameters : []);
      return inner.logQueryError(error, query, redactParameters(query, parameters) as any[] | undefined, queryRunner);
    },
    logQuerySlow: (time: number, query: string, parameters?: unknown, queryRunner?: unknown) =>
      inner.logQuerySlow(time, query, redactParameters(query, parameters) as any[] | undefined, queryRunner),
    logSchemaBuild: (message: string, queryRunner?: unknown) => inner.logSchemaBuild(message, queryRunner),
    logMigration: (message: string, queryRunner?: unknown) => inner.logMigration(message, queryRunner),
    log: (level: 'log' | 'info' | 'warn', message: unknown, queryRunner?: unknown) => inner.log(level, message, queryRunner),
  };
  return wrapper;
}

/** Data sources whose logger is already guarded. */
const guarded = new WeakSet<SourceDataSource>();

/** Puts the redacting wrapper around `dataSource.logger`, now and whenever it is replaced (`setOptions({ logger })`). */
export function installRedactingLogger(dataSource: SourceDataSource): void {
  if (guarded.has(dataSource)) return;
  guarded.add(dataSource);
  let current = redactingLogger(dataSource.logger);
  Object.defineProperty(dataSource, 'logger', {
    configurable: true,
    enumerable: true,
    get: () => current,
    set: (next: StatementLogger) => {
      current = redactingLogger(next);
    },
  });
}

/** DI token of the provider that guards the module's data source logger at start-up. */
export const QUERY_LOG_REDACTION = Symbol('nest-idempotency:query-log-redaction');
