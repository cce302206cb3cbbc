/** Counts occurrences, e.g. answers by label. */
export function tally(values: Iterable<string>): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1;
  return Object.fromEntries(Object.entries(counts).sort(([a], [b]) => a.localeCompare(b)));
}

/**
 * Prints what a scenario measured, one line, so a reader of the run sees what
 * was proven. Every figure passed here must come from an observation.
 */
export function printFigures(scenario: string, figures: Record<string, number | string | Record<string, number>>): void {
  const parts = Object.entries(figures).map(([name, value]) =>
    typeof value === 'object'
      ? `${name} {${Object.entries(value)
          .map(([k, v]) => `${k}: ${v}`)
          .join(', ')}}`
      : `${name} ${value}`,
  );
  console.log(`[reliability/${scenario}] ${parts.join(', ')}`);
}
