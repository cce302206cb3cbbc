import type { SourceQueryRunner } from '../connection.js';
import type { PgClient } from './pools.js';

/**
 * Runs TypeORM's `startTransaction()`, `commitTransaction()` or `rollbackTransaction()` with its statement replaced
 * by `send`, so the app's subscribers and TypeORM's bookkeeping see the transaction as usual.
 */
export async function withTransactionStatementReplaced(
  runner: SourceQueryRunner,
  statement: 'START TRANSACTION' | 'COMMIT' | 'ROLLBACK',
  send: (client: PgClient, statement: string) => Promise<void>,
): Promise<void> {
  // TypeORM sends the data source's isolation level after START TRANSACTION (validated): it goes into it instead.
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
