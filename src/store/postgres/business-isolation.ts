import type { Pools } from './pools.js';

/**
 * Whether the work's transactions run at READ COMMITTED (or READ UNCOMMITTED, the same in PostgreSQL): the data
 * source's `isolationLevel`, else its connections' default.
 */
export async function readsCommitted(pools: Pools): Promise<boolean> {
  const level = pools.main.options.isolationLevel;
  if (level) return level === 'READ COMMITTED' || level === 'READ UNCOMMITTED';
  const { rows } = await pools.run({ text: 'SHOW default_transaction_isolation', values: [] }, { source: pools.main });
  const shown = (rows as Array<{ default_transaction_isolation: string }>)[0]?.default_transaction_isolation;
  return shown === 'read committed' || shown === 'read uncommitted';
}
