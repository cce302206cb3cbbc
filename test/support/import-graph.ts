import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const STATIC_IMPORT = /^\s*(?:import|export)\s+(type\s+)?(?:[^'";]*?\sfrom\s+)?['"]([^'"]+)['"]/gm;

/**
 * Every module `entry` reaches through static imports (type-only ones too
 * when `withTypes`), and the bare specifiers (packages) they name, with the
 * files that name them. Dynamic `import()` is not followed: that is how
 * optional peers stay optional.
 */
export function importGraph(entry: string, withTypes: boolean): { files: string[]; packages: Map<string, string[]> } {
  const files = new Set<string>();
  const packages = new Map<string, string[]>();
  const visit = (file: string) => {
    if (files.has(file)) return;
    files.add(file);
    const source = readFileSync(file, 'utf8');
    for (const [, typeOnly, specifier] of source.matchAll(STATIC_IMPORT)) {
      if (typeOnly && !withTypes) continue;
      if (specifier.startsWith('.')) visit(resolve(dirname(file), specifier.replace(/\.js$/, '.ts')));
      else packages.set(specifier, [...(packages.get(specifier) ?? []), relative(ROOT, file)]);
    }
  };
  visit(join(ROOT, entry));
  return { files: [...files].map((file) => relative(ROOT, file)), packages };
}

/** The package a bare specifier names: `@nestjs/common/constants.js` is `@nestjs/common`. */
export function packageOf(specifier: string): string {
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
}
