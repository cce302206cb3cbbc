import { quoteTableName } from './identifiers.js';

/**
 * Where the key table's functions run. `'postgres'` (the default): one server, the texts as they always were.
 * `'citus'`: the table is distributed by tenant and the functions are delegated to the worker holding the
 * tenant's shard (`create_distributed_function`, see src/store/citus/). There Citus still plans each statement
 * of the function against the distributed table and refuses a STABLE function (`now()`) in `ON CONFLICT DO
 * UPDATE` ("must be marked IMMUTABLE") and a VOLATILE one (`clock_timestamp()`, `gen_random_uuid()`) in an
 * `UPDATE` ("must not be VOLATILE"); so the Citus texts read the clocks once into variables and use those.
 * `now()` is the transaction's start whichever way it is read, so `v_now` is the same value; `v_clock` is read
 * at the function's start instead of during its statement (microseconds earlier).
 */
export type FunctionDialect = 'postgres' | 'citus';

/** SQLSTATE a delegated key function raises when it runs on a node that does not hold the tenant's shard (Citus). */
export const NOT_DELEGATED_SQLSTATE = 'NI503';

/**
 * A plpgsql guard for the Citus dialect: the tenant's shard of the key table is on this node (Citus's metadata
 * cache, no table scan). Citus runs a distributed function on the node that received the call, silently,
 * whenever it cannot delegate it (an argument that is not a constant or a parameter, "arguments in a
 * distributed function must be constant expressions" at DEBUG1): the key's lock would then be taken on that
 * node instead of the shard's, and the claims of one key would no longer exclude each other.
 */
export function delegatedGuard(tableName: string): string {
  const literal = `'${quoteTableName(tableName).replace(/'/g, "''")}'`;
  return `IF NOT EXISTS (SELECT 1 FROM pg_dist_placement p
                         WHERE p.shardid = get_shard_id_for_distribution_column(${literal}::regclass, p_tenant)
                           AND p.groupid = (SELECT groupid FROM pg_dist_local_group)) THEN
         RAISE EXCEPTION 'a key function of % ran on a node without the tenant''s shard (the call was not delegated)', ${literal}
           USING ERRCODE = '${NOT_DELEGATED_SQLSTATE}',
                 HINT = 'create_distributed_function(..., ''p_tenant'', colocate_with => ..., force_delegation => true), and call it with constant or parameter arguments';
       END IF;`;
}

/**
 * What a key function's text differs by between the dialects: the clock expressions its DML statements use,
 * the variables the Citus texts declare, and the Citus texts' delegation guard (first statement of the body).
 */
export function dialectParts(
  dialect: FunctionDialect,
  tableName: string,
): { now: string; clock: string; declare: string; guard: string; attributes: string } {
  return dialect === 'citus'
    ? {
        // A delegated function runs on the worker's connection, whose search_path is the worker's default, not the
        // app's: an unqualified table name there reached public.idempotency_keys instead of the app's schema's table.
        // The function keeps the search_path it was created with (the app's: run the distribution with it).
        attributes: ' SET search_path FROM CURRENT',
        now: 'v_now',
        clock: 'v_clock',
        declare: 'v_now timestamptz := now();\n       v_clock timestamptz := clock_timestamp();',
        guard: `${delegatedGuard(tableName)}\n       `,
      }
    : { now: 'now()', clock: 'clock_timestamp()', declare: '', guard: '', attributes: '' };
}
