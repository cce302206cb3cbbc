import { quoteTableName } from '../identifiers.js';
import { NOT_DELEGATED_SQLSTATE } from '../function-dialect.js';
import { citusFunctionSignatures } from './citus.sql.js';

/**
 * What the start-up check reads, with the module option `citus: true`, to recognise the Citus layout and to refuse
 * a half-distributed one. `query` runs one parameterised statement on the coordinator (the data source's `query`).
 * Returns one message naming every problem and the fix, or none when the layout is complete.
 */
export async function citusLayoutProblems(
  query: (sql: string, params: unknown[]) => Promise<unknown[]>,
  layout: { tableName: string; outboxTableName?: string; ledgerTableName?: string; colocateWith?: string },
): Promise<string[]> {
  const [citus] = (await query(`SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL AS installed`, [])) as Array<{
    installed: boolean;
  }>;
  const fix =
    'Run distributeIdempotencyTables(dataSource, { colocateWith: <a business table distributed by tenant>, ... }) on the ' +
    'coordinator (docs/scaling.md, "Past one server"), or leave `citus` out to run on one server.';
  if (!citus.installed) {
    return [`IdempotencyModule: \`citus: true\` is set, but this database has no Citus (no pg_dist_partition). ${fix}`];
  }
  const tables = [layout.tableName, layout.outboxTableName, layout.ledgerTableName, layout.colocateWith].filter(
    (name): name is string => name !== undefined,
  );
  // One row per table: distributed or not, by which column, in which co-location group.
  const rows = (await query(
    `SELECT n AS name, p.logicalrelid IS NOT NULL AS distributed, p.partmethod AS method,
            CASE WHEN p.partkey IS NOT NULL THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column,
            p.colocationid AS colocation
       FROM unnest($1::text[]) n LEFT JOIN pg_dist_partition p ON p.logicalrelid = to_regclass(n)`,
    [tables.map(quoteTableName)],
  )) as Array<{ name: string; distributed: boolean; method: string | null; column: string | null; colocation: number | null }>;
  const keys = rows[0];
  const anyDistributed = rows.some((row) => row.distributed);
  if (!anyDistributed) {
    return [
      `IdempotencyModule: \`citus: true\` is set, but none of the tables ${rows.map((r) => r.name).join(', ')} is distributed. ${fix}`,
    ];
  }
  const problems: string[] = [];
  for (const row of rows) {
    if (!row.distributed)
      problems.push(`the table ${row.name} is not distributed, while ${rows.find((r) => r.distributed)!.name} is.`);
    else if (row.method !== 'h' || row.column !== 'tenant_id') {
      problems.push(
        `the table ${row.name} is distributed by ${row.column ?? `method ${row.method}`}, not hash-distributed by tenant_id.`,
      );
    } else if (keys.distributed && row.colocation !== keys.colocation) {
      problems.push(`the table ${row.name} is not co-located with ${keys.name}: a request's writes would span shards.`);
    }
  }
  if (keys.distributed) {
    // Each key function: delegated by its first argument (the tenant), co-located with the key table, forced
    // into transaction blocks, and the Citus text (its delegation guard; the plain text fails on a worker).
    const functions = (await query(
      `SELECT s AS signature, p.oid IS NOT NULL AS present, d.distribution_argument_index AS argument,
              d.colocationid AS colocation, coalesce(d.force_delegation, false) AS forced,
              coalesce(position($2 IN p.prosrc) > 0, false) AS citus_text
         FROM unnest($1::text[]) s
         LEFT JOIN pg_proc p ON p.oid = to_regprocedure(s)
         LEFT JOIN pg_dist_object d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid`,
      [citusFunctionSignatures(layout.tableName), NOT_DELEGATED_SQLSTATE],
    )) as Array<{
      signature: string;
      present: boolean;
      argument: number | null;
      colocation: number | null;
      forced: boolean;
      citus_text: boolean;
    }>;
    for (const f of functions) {
      if (!f.present) problems.push(`the function ${f.signature} does not exist.`);
      else if (f.argument !== 0 || f.colocation !== keys.colocation || !f.forced) {
        problems.push(
          `the function ${f.signature} is not delegated by its tenant argument with the key table (force_delegation).`,
        );
      } else if (!f.citus_text) problems.push(`the function ${f.signature} has the single-server text, which a worker refuses.`);
    }
  }
  return problems.length === 0 ? [] : [`IdempotencyModule: the Citus layout is incomplete: ${problems.join(' ')} ${fix}`];
}
