import type { SourceQueryRunner } from '../connection.js';
import type { PgClient } from './pools.js';

/**
 * Runs TypeORM's `startTransaction()`, `commitTransaction()` or `rollbackTransaction()` with its one statement
 * replaced by `send` (given as it should go, isolation level included), so the app's subscribers and TypeORM's
 * bookkeeping see the transaction as usual while the statement travels with the module's (or not at all).
 */
export async function withTransactionStatementReplaced(
  runner: SourceQueryRunner,
  statement: 'START TRANSACTION' | 'COMMIT' | 'ROLLBACK',
  send: (client: PgClient, statement: string) => Promise<void>,
): Promise<void> {
  // TypeORM follows START TRANSACTION with the data source's isolation level, which must come before any other
  // statement of the transaction: it goes into the message instead (TypeORM has validated it as one of the levels).
  const level = statement === 'START TRANSACTION' ? runner.connection.options.isolationLevel : undefined;
  const sent = level && /^[A-Z ]+$/.test(level) ? `START TRANSACTION ISOLATION LEVEL ${level}` : statement;
  const own = runner as SourceQueryRunner & { query: SourceQueryRunner['query'] };
  const original = Object.getPrototypeOf(runner).query as SourceQueryRunner['query'];
  // The prototype's query is assigned back, never the override deleted: a delete would turn the runner into a
  // dictionary-mode object, and every property read of TypeORM on it (the handler's statements) slower.
  const restore = () => (own.query = original);
  own.query = async function (this: SourceQueryRunner, sql: string, ...rest: unknown[]) {
    if (sql === statement) {
      await send((await runner.connect()) as PgClient, sent);
      if (sent === statement) restore();
      return [];
    }
    if (sent !== statement && sql.startsWith('SET TRANSACTION ISOLATION LEVEL')) {
      restore();
      return [];
    }
    return (original as (...args: unknown[]) => Promise<unknown>).call(this, sql, ...rest);
  } as SourceQueryRunner['query'];
  try {
    if (statement === 'START TRANSACTION') await runner.startTransaction();
    else if (statement === 'COMMIT') await runner.commitTransaction();
    else await runner.rollbackTransaction();
  } finally {
    restore();
  }
}
