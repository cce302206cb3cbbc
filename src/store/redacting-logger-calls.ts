import type { StatementLogger } from './connection.js';
import { redactQueryError } from './redacted-query-error.js';

/** The redacting logger's calls other than `logQuery` (see `redactingLogger`); `redact` hides the module's values. */
export function otherLogCalls(
  inner: StatementLogger,
  redact: <P>(sql: string, parameters: P) => P,
  isModuleSql: (sql: unknown) => boolean,
): Omit<StatementLogger, 'logQuery'> {
  return {
    logQueryError: (error: string | Error, query: string, parameters?: unknown, queryRunner?: unknown) => {
      // Redacted in place: TypeORM builds its QueryFailedError from this same driver error right after.
      if (isModuleSql(query) && typeof error === 'object') redactQueryError(error, Array.isArray(parameters) ? parameters : []);
      return inner.logQueryError(error, query, redact(query, parameters) as any[] | undefined, queryRunner);
    },
    logQuerySlow: (time: number, query: string, parameters?: unknown, queryRunner?: unknown) =>
      inner.logQuerySlow(time, query, redact(query, parameters) as any[] | undefined, queryRunner),
    logSchemaBuild: (message: string, queryRunner?: unknown) => inner.logSchemaBuild(message, queryRunner),
    logMigration: (message: string, queryRunner?: unknown) => inner.logMigration(message, queryRunner),
    log: (level: 'log' | 'info' | 'warn', message: unknown, queryRunner?: unknown) => inner.log(level, message, queryRunner),
  };
}
