import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const STATIC_IMPORT = /^\s*(?:import|export)\s+(type\s+)?(?:[^'";]*?\sfrom\s+)?['"]([^'"]+)['"]/gm;

/**
 * Every module `entry` reaches through static imports (type-only ones too
 * when `withTypes`), and the bare specifiers (packages) they name. Dynamic
 * `import()` is not followed: that is how optional peers stay optional.
 */
function importGraph(entry: string, withTypes: boolean): { files: string[]; packages: Map<string, string[]> } {
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

describe('the nest-idempotency-pg/client subpath', () => {
  it('imports nothing but Node built-ins, at run time or in its types: no Nest, rxjs, TypeORM or reflect-metadata', () => {
    const { files, packages } = importGraph('src/client/index.ts', true);
    expect(files.length).toBeGreaterThan(5);
    expect([...packages.keys()].filter((name) => !name.startsWith('node:'))).toEqual([]);
  });

  it('is exported as ./client, pointing at the build of src/client/index.ts', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    const build = JSON.parse(readFileSync(join(ROOT, 'tsconfig.build.json'), 'utf8'));
    expect(pkg.exports['./client']).toEqual({
      types: './dist/client/index.d.ts',
      import: './dist/client/index.js',
      default: './dist/client/index.js',
    });
    // tsconfig.build.json compiles src/ into dist/, so src/client/index.ts lands at dist/client/index.js.
    expect({ rootDir: build.compilerOptions.rootDir, outDir: build.compilerOptions.outDir, include: build.include }).toEqual({
      rootDir: 'src',
      outDir: 'dist',
      include: ['src'],
    });
  });
});

describe('the main entry and the optional HTTP integrations', () => {
  it('loads neither @nestjs/axios nor axios unless IdempotentHttpModule is registered', () => {
    const { files, packages } = importGraph('src/index.ts', false);
    expect(files).toContain('src/outbound/idempotent-http.module.ts');
    expect([...packages.keys()].filter((name) => /(^|\/)axios$/.test(name))).toEqual([]);
  });

  it('declares them as optional peers', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    for (const name of ['@nestjs/axios', 'axios']) {
      expect({ name, peer: typeof pkg.peerDependencies[name], optional: pkg.peerDependenciesMeta[name]?.optional }).toEqual({
        name,
        peer: 'string',
        optional: true,
      });
    }
  });
});
