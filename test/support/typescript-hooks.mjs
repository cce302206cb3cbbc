// Module hooks that let a plain `node` process load this repository's TypeScript
// sources, as Jest's ts-jest does for the specs: Node 20 cannot strip types, and a
// child process of a test should run the sources as they are, not a stale build.
// Registered by run-typescript.mjs. Transpile only: type-checking is `npm run typecheck`.
import { existsSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath, URL } from 'node:url';
import ts from 'typescript';

const ROOT = new URL('../../', import.meta.url);
const PACKAGE = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8'));

/**
 * The package's own entry points (`nest-idempotency-pg`, `.../client`, ...) as their
 * sources, read off package.json's `exports` (`./dist/x/index.js` is built from
 * `src/x/index.ts`), so a program written as a user would write it (the README's
 * Quick start) runs against the sources from anywhere, as check:docs compiles it.
 */
const ENTRY_POINTS = new Map(
  Object.entries(PACKAGE.exports)
    .filter(([, target]) => typeof target === 'object' && target.import?.startsWith('./dist/'))
    .map(([subpath, target]) => [
      PACKAGE.name + subpath.slice(1),
      new URL(target.import.replace(/^\.\/dist\//, 'src/').replace(/\.js$/, '.ts'), ROOT).href,
    ]),
);

const compilerOptions = {
  module: ts.ModuleKind.ESNext,
  target: ts.ScriptTarget.ES2022,
  experimentalDecorators: true,
  emitDecoratorMetadata: true,
  inlineSourceMap: true,
};

export async function resolve(specifier, context, nextResolve) {
  const entryPoint = ENTRY_POINTS.get(specifier);
  if (entryPoint) return { url: entryPoint, shortCircuit: true };
  // The sources import each other as `./file.js` (what the build emits); on disk it is `./file.ts`.
  if (specifier.startsWith('.') && specifier.endsWith('.js') && context.parentURL?.endsWith('.ts')) {
    const url = new URL(specifier.replace(/\.js$/, '.ts'), context.parentURL);
    if (existsSync(fileURLToPath(url))) return { url: url.href, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}

export async function load(url, context, nextLoad) {
  if (!url.endsWith('.ts')) return nextLoad(url, context);
  const fileName = fileURLToPath(url);
  const { outputText } = ts.transpileModule(await readFile(fileName, 'utf8'), { compilerOptions, fileName });
  return { format: 'module', source: outputText, shortCircuit: true };
}
