import type { PgClient } from './pools.js';
import type { PgQuery, QueryClass } from './node-postgres-types.js';

/** Marks a Query the deferred BEGIN made itself (for a text and values), whose caller gets a promise or a callback. */
export const OWN = Symbol('made by the deferred BEGIN');

/** node-postgres's Query class, when the client is node-postgres's JavaScript client (not pg-native). */
export function queryClassOf(client: PgClient): QueryClass | undefined {
  const Query = (client.constructor as { Query?: unknown }).Query;
  const connection = (client as { connection?: { parse?: unknown } }).connection;
  return typeof Query === 'function' && typeof connection?.parse === 'function' ? (Query as QueryClass) : undefined;
}

/** node-postgres's Query for `client.query(config, values, callback)`, and what that call returns, as it makes them. */
export function queryOf(Query: QueryClass, config: unknown, values: unknown, callback: unknown): [PgQuery, unknown] {
  if (typeof (config as { submit?: unknown } | null)?.submit === 'function') return [config as PgQuery, undefined];
  const query = Object.assign(new Query(config, values, callback), { [OWN]: true });
  if (query.callback) return [query, undefined];
  const result = new Promise((resolve, reject) => {
    query.callback = (error, rows) => (error ? reject(error) : resolve(rows));
  });
  return [query, result];
}
