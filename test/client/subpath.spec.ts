import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { importGraph, ROOT } from '../support/import-graph.js';

describe('the nest-idempotency-pg/client subpath', () => {
  it('imports nothing but Node built-ins, at run time or in its types: no Nest, rxjs, TypeORM or reflect-metadata', () => {
    const { files, packages } = importGraph('src/client/index.ts', true);
    expect(files.length).toBeGreaterThan(5);
    expect([...packages.keys()].filter((name) => !name.startsWith('node:'))).toEqual([]);
  });

  it('reaches no file of the Nest side: only src/client and the framework-free core (its messages are its own)', () => {
    const { files } = importGraph('src/client/index.ts', true);
    expect(files.filter((file) => !/^src\/(client|core)\//.test(file))).toEqual([]);
    // The core files it reaches are the wire's names and the key derivation, not the engine or its store port.
    expect(files.filter((file) => file.startsWith('src/core/')).sort()).toEqual([
      'src/core/configuration-error.ts',
      'src/core/derived-keys.ts',
      'src/core/protocol.ts',
    ]);
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
