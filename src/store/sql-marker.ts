/** Opens every statement of the module: tells its SQL from the app's, and names it in `pg_stat_statements`. */
export const MODULE_SQL_MARKER = '/* nest-idempotency:';

/** The marker comment that opens the module's statement `name` (e.g. `sqlMarker('claim')`). */
export function sqlMarker(name: string): string {
  return `${MODULE_SQL_MARKER}${name} */`;
}
