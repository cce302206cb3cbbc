/** What kind of value `value` is, for a message: never its content. */
export function typeName(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (typeof value !== 'object') return `a ${typeof value}`;
  return `an object (${(value as object).constructor?.name ?? 'without a prototype'})`;
}
