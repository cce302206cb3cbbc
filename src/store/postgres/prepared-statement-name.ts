import { createHash } from 'node:crypto';
import type { ClaimFunction } from './claim-row.js';

/** A prepared statement's name (`preparedStatements`): one per table, so stores of different tables never collide. */
export function statementName(table: string, name: ClaimFunction | 'complete' | 'complete_or_raise'): string {
  return `nest_idem_${name}_${createHash('sha1').update(table).digest('hex').slice(0, 12)}`;
}
