/** Quotes a possibly schema-qualified table name (`schema.table`) as SQL identifiers. */
export function quoteTableName(name: string): string {
  return name
    .split('.')
    .map((part) => `"${part.replace(/"/g, '""')}"`)
    .join('.');
}
