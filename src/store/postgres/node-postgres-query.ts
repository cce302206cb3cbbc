import type { PgClient } from './pools.js';

/** What a statement of the work answered, as node-postgres's callback gets it. */
type Callback = (error: Error | null, result?: unknown) => void;

/** node-postgres's `Query` (a submittable), as far as the deferred BEGIN drives it. */
export interface PgQuery {
  text?: string;
  name?: string;
  callback?: Callback;
  submit(connection: PgConnection): Error | null | undefined;
  requiresPreparation(): boolean;
  hasBeenParsed(connection: PgConnection): boolean;
  handleCommandComplete(message: unknown, connection: PgConnection): void;
  handleError(error: Error, connection: PgConnection): void;
  handleReadyForQuery(connection: PgConnection): void;
}

/** node-postgres's connection: the protocol messages the deferred BEGIN writes ahead of a statement. */
export interface PgConnection {
  parse(query: { text: string; name?: string }): void;
  bind(config: { portal?: string; statement?: string; values?: unknown[] }): void;
  execute(config: { portal?: string; rows?: number }): void;
  parsedStatements: Record<string, string | undefined>;
  stream: { cork?: () => void; uncork?: () => void };
}

export type QueryClass = new (config: unknown, values?: unknown, callback?: unknown) => PgQuery;

/** Marks a Query the deferred BEGIN made itself (for a text and values), whose caller gets a promise or a callback. */
export const OWN = Symbol('made by the deferred BEGIN');

/** node-postgres's Query class, when the client is node-postgres's JavaScript client (not pg-native). */
export function queryClassOf(client: PgClient): QueryClass | undefined {
  const Query = (client.constructor as { Query?: unknown }).Query;
  const connection = (client as { connection?: { parse?: unknown } }).connection;
  return typeof Query === 'function' && typeof connection?.parse === 'function' ? (Query as QueryClass) : undefined;
}

/**
 * node-postgres's Query for `client.query(config, values, callback)`, and
 * what that call returns (a promise when there is no callback), as
 * node-postgres makes them.
 */
export function queryOf(Query: QueryClass, config: unknown, values: unknown, callback: unknown): [PgQuery, unknown] {
  if (typeof (config as { submit?: unknown } | null)?.submit === 'function') return [config as PgQuery, undefined];
  const query = Object.assign(new Query(config, values, callback), { [OWN]: true });
  if (query.callback) return [query, undefined];
  const result = new Promise((resolve, reject) => {
    query.callback = (error, rows) => (error ? reject(error) : resolve(rows));
  });
  return [query, result];
}
