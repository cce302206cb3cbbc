import type { SourceQueryRunner } from '../connection.js';
import { queryOf } from './node-postgres-query.js';
import type { PgConnection, PgQuery, QueryClass } from './node-postgres-types.js';

/** What the fallbacks use of the deferred BEGIN (`DeferredBegin`). */
export interface BeginOnItsWay {
  /** The BEGIN's text. */
  readonly statement: string;
  /** The BEGIN opened the transaction. */
  readonly opened: boolean;
  /** Why it did not, once that is known. */
  readonly failure?: Error;
  watchBegin(query: PgQuery, carried: boolean): void;
  send(query: PgQuery, values: unknown, callback: unknown): unknown;
}

/**
 * The deferred BEGIN when the work's first statement cannot carry it: a
 * cursor or a stream (TypeORM's `stream()`) keeps its portal open across round
 * trips, and a named statement not yet parsed would have node-postgres file
 * the BEGIN's parse under its name. The BEGIN goes first, on its own, and
 * `query` runs only once it answered that the transaction is open; it fails
 * with the BEGIN's error otherwise, as statements of an aborted transaction
 * fail.
 */
export function sendBeginAlone(begin: BeginOnItsWay, Query: QueryClass, query: PgQuery): void {
  // Its outcome is read off its answers (see watchBegin); an error reaches the statements held back behind it.
  const own = new Query(begin.statement, undefined, () => undefined);
  begin.watchBegin(own, false);
  begin.send(own, undefined, undefined);
  holdBack(begin, query);
}

/**
 * A statement sent after the BEGIN but before its answer: node-postgres sends it once the statements before it
 * answered, and by then the BEGIN's outcome is known. It runs only inside the opened transaction.
 */
export function sendAfterBegin(
  begin: BeginOnItsWay,
  Query: QueryClass,
  config: unknown,
  values: unknown,
  callback: unknown,
): unknown {
  const [query, result] = queryOf(Query, config, values, callback);
  holdBack(begin, query);
  return begin.send(query, values, callback) ?? result;
}

/** Makes `query` fail, unsent, unless the BEGIN has opened the transaction by the time node-postgres sends it. */
function holdBack(begin: BeginOnItsWay, query: PgQuery): void {
  const submit = query.submit;
  query.submit = (connection: PgConnection) => {
    query.submit = submit;
    if (!begin.opened) return begin.failure ?? new Error('The transaction of the work has not opened.');
    return submit.call(query, connection);
  };
}

/** On a client other than node-postgres's JavaScript one, the BEGIN cannot be deferred: sent and awaited now. */
export async function startAtOnce(runner: SourceQueryRunner): Promise<undefined> {
  await runner.startTransaction();
  return undefined;
}
