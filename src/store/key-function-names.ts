import { quoteTableName } from './identifiers.js';
import { keyStoreFunction as fn } from './key-function-parts.sql.js';

/** The key table's functions, quoted as the store calls them. */
export function keyStoreFunctionNames(tableName: string): string[] {
  const t = quoteTableName(tableName);
  return [
    fn(t, 'claim'),
    fn(t, 'complete'),
    fn(t, 'complete_or_raise'),
    fn(t, 'claim_in_transaction'),
    fn(t, 'complete_in_transaction'),
  ];
}
