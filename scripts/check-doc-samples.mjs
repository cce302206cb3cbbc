// `npm run check:docs`: every TypeScript sample in README.md and docs/**/*.md compiles.
//
// Each ```ts (or ```typescript) block becomes a module of its own (so samples never see
// each other's names) and is type-checked with the repository's TypeScript and
// tsconfig.json (strict), against the library's source: `nest-idempotency-pg` and each of
// its subpaths (`nest-idempotency-pg/client`, `/health`, ...) are mapped to src/ exactly as
// package.json's `exports` map them to dist/. Nothing is emitted.
//
// A sample that needs context the reader does not (an import, a class of the reader's own
// application) gets it from a hidden prelude: an HTML comment, which Markdown does not
// render, right above the fence (blank lines between are allowed):
//
//   <!-- prelude
//   import { Injectable } from '@nestjs/common';
//   declare class Charge { id: string }
//   -->
//   ```ts
//   ...
//
// The prelude is prepended to the sample; it may only declare and import, so the sample
// stays real API. Shell, JSON and other blocks are not compiled.
//
// A ```json block holding `compilerOptions` is an app's tsconfig.json: it must build a small
// NestJS app (decorators with their metadata, Node's types), emitting as `tsc -p` would, so
// an option the current TypeScript refuses (TS 6's `rootDir` next to `outDir`) fails here.
//
// Errors name the Markdown file and line (of the sample, or of the prelude line at fault).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/**
 * Where the library's entry points live in the source tree: each entry of package.json's
 * `exports` with types, its `dist/**.d.ts` read back as the `src/**.ts` it is built from.
 */
const ENTRY_POINTS = (() => {
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  const entries = {};
  for (const [subpath, target] of Object.entries(manifest.exports)) {
    if (typeof target !== 'object' || typeof target.types !== 'string') continue;
    entries[`${manifest.name}${subpath.slice(1)}`] = target.types.replace(/^\.\/dist\//, 'src/').replace(/\.d\.ts$/, '.ts');
  }
  return entries;
})();

const TS_FENCE = new Set(['ts', 'typescript']);

function markdownFiles() {
  const found = ['README.md'];
  const walk = (dir) => {
    for (const name of readdirSync(join(root, dir)).sort()) {
      const path = join(dir, name);
      if (statSync(join(root, path)).isDirectory()) walk(path);
      else if (name.endsWith('.md')) found.push(path);
    }
  };
  walk('docs');
  return found;
}

/**
 * The TypeScript samples of one Markdown file: their code, the hidden prelude above each,
 * and the (1-based) lines where each starts in the file.
 */
function extractSamples(file) {
  const lines = readFileSync(join(root, file), 'utf8').split('\n');
  const samples = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)/.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, lang] = open;
    let end = i + 1;
    while (end < lines.length && !(lines[end].trim().startsWith(fence) && lines[end].trim().replace(/[`~]/g, '') === '')) end++;
    if (end === lines.length) throw new Error(`${file}:${i + 1}: a code block that is never closed`);
    const code = lines.slice(i + 1, end).map((line) => (line.startsWith(indent) ? line.slice(indent.length) : line));
    if (TS_FENCE.has(lang.toLowerCase())) {
      samples.push({ file, codeLine: i + 2, code, ...preludeAbove(lines, i, file) });
    } else if (lang.toLowerCase() === 'json' && code.some((line) => line.includes('"compilerOptions"'))) {
      tsconfigSamples.push({ file, codeLine: i + 2, text: code.join('\n') });
    }
    i = end;
  }
  return samples;
}

/** The `<!-- prelude ... -->` comment ending right above the fence on line `fenceIndex` (0-based), if any. */
function preludeAbove(lines, fenceIndex, file) {
  let close = fenceIndex - 1;
  while (close >= 0 && lines[close].trim() === '') close--;
  if (close < 0 || lines[close].trim() !== '-->') return { prelude: [], preludeLine: 0 };
  let open = close - 1;
  while (open >= 0 && !lines[open].includes('<!--')) open--;
  if (open < 0 || lines[open].trim() !== '<!-- prelude') return { prelude: [], preludeLine: 0 };
  const prelude = lines.slice(open + 1, close).map((line) => line.trim());
  checkPrelude(prelude, file, open + 2);
  return { prelude, preludeLine: open + 2 };
}

/**
 * A prelude gives context, never behaviour, so the sample itself shows the real API: each of its
 * statements must be an import, a type or interface, or a `declare` statement.
 */
function checkPrelude(prelude, file, firstLine) {
  const source = ts.createSourceFile('prelude.ts', prelude.join('\n'), ts.ScriptTarget.Latest, true);
  for (const statement of source.statements) {
    const declared =
      ts.canHaveModifiers(statement) && ts.getModifiers(statement)?.some((m) => m.kind === ts.SyntaxKind.DeclareKeyword);
    if (
      ts.isImportDeclaration(statement) ||
      ts.isTypeAliasDeclaration(statement) ||
      ts.isInterfaceDeclaration(statement) ||
      declared
    ) {
      continue;
    }
    const { line } = source.getLineAndCharacterOfPosition(statement.getStart());
    throw new Error(`${file}:${firstLine + line}: a prelude may only import or declare (import, type, interface, declare)`);
  }
}

function compilerOptions() {
  const configPath = join(root, 'tsconfig.json');
  const config = ts.readConfigFile(configPath, ts.sys.readFile);
  if (config.error) throw new Error(ts.flattenDiagnosticMessageText(config.error.messageText, '\n'));
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root, undefined, configPath);
  const paths = Object.fromEntries(Object.entries(ENTRY_POINTS).map(([name, path]) => [name, [join(root, path)]]));
  return {
    ...parsed.options,
    strict: true,
    noEmit: true,
    // Every sample is a module, also one without an import: no names leak between samples, and top-level await works.
    moduleDetection: ts.ModuleDetectionKind.Force,
    paths,
    pathsBasePath: root,
  };
}

/** The tsconfig.json samples (```json blocks with `compilerOptions`), filled by extractSamples. */
const tsconfigSamples = [];

let samples;
try {
  samples = markdownFiles().flatMap(extractSamples);
} catch (error) {
  // A malformed document (an unclosed block, a prelude that does more than declare): say where, without a stack.
  console.error(`check:docs: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
const virtual = new Map();
for (const [n, sample] of samples.entries()) {
  const name = join(root, '.doc-samples', `${sample.file.replace(/[^A-Za-z0-9]/g, '_')}_${sample.codeLine}_${n}.ts`);
  sample.path = name;
  virtual.set(name, [...sample.prelude, ...sample.code].join('\n') + '\n');
}

const options = compilerOptions();
const host = ts.createCompilerHost(options, true);
const { fileExists, readFile, getSourceFile } = host;
host.fileExists = (path) => virtual.has(path) || fileExists.call(host, path);
host.readFile = (path) => virtual.get(path) ?? readFile.call(host, path);
host.getSourceFile = (path, languageVersion, onError, shouldCreate) =>
  virtual.has(path)
    ? ts.createSourceFile(path, virtual.get(path), languageVersion, true)
    : getSourceFile.call(host, path, languageVersion, onError, shouldCreate);

const program = ts.createProgram({ rootNames: [...virtual.keys()], options, host });

// The samples must be checked against src/, never against a built dist/ (the package can import itself by name).
for (const [name, path] of Object.entries(ENTRY_POINTS)) {
  const probe = ts.resolveModuleName(name, samples[0]?.path ?? join(root, 'x.ts'), options, host);
  const resolved = probe.resolvedModule?.resolvedFileName;
  if (resolved !== join(root, path)) throw new Error(`check:docs: ${name} resolves to ${resolved ?? 'nothing'}, not ${path}`);
}

const bySample = new Map(samples.map((sample) => [sample.path, sample]));
const problems = [];
for (const diagnostic of ts.getPreEmitDiagnostics(program)) {
  const sample = diagnostic.file && bySample.get(diagnostic.file.fileName);
  const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ');
  if (!diagnostic.file) {
    problems.push({ file: '', line: 0, text: `tsconfig: error TS${diagnostic.code}: ${message}` });
    continue;
  }
  // Errors inside src/ are the type-check's to report (npm run typecheck); here only the samples count.
  if (!sample) continue;
  const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
  const inPrelude = line < sample.prelude.length;
  const mdLine = inPrelude ? sample.preludeLine + line : sample.codeLine + line - sample.prelude.length;
  problems.push({
    file: sample.file,
    line: mdLine,
    text:
      `${sample.file}:${mdLine}:${character + 1}: error TS${diagnostic.code}: ${message}` +
      `${inPrelude ? ' (in the prelude)' : ''} [sample at line ${sample.codeLine}]`,
  });
}

problems.push(...tsconfigSamples.flatMap(checkTsconfigSample));

/**
 * Builds a small NestJS app with a documented tsconfig.json, in memory: the options as a
 * reader would paste them, the app under the first `include` directory, and an emit (to
 * nowhere), because some option errors (TS5011) are only reported by an emitting build.
 */
function checkTsconfigSample(sample) {
  const at = `${sample.file}:${sample.codeLine}`;
  const parsedJson = ts.parseConfigFileTextToJson('tsconfig.json', sample.text);
  if (parsedJson.error) {
    return [
      {
        file: sample.file,
        line: sample.codeLine,
        text: `${at}: not JSON: ${ts.flattenDiagnosticMessageText(parsedJson.error.messageText, ' ')}`,
      },
    ];
  }
  const project = join(root, '.doc-tsconfig');
  const include = parsedJson.config.include?.[0] ?? 'src';
  const main = join(project, include, 'main.ts');
  const app = [
    "import { Controller, Get, Injectable } from '@nestjs/common';",
    '@Injectable()',
    'export class Greeter {',
    "  greet = (): string => process.env.GREETING ?? 'hello';",
    '}',
    "@Controller('hello')",
    'export class HelloController {',
    '  constructor(private readonly greeter: Greeter) {}',
    '  @Get()',
    '  hello(): string {',
    '    return this.greeter.greet();',
    '  }',
    '}',
    '',
  ].join('\n');
  const system = { ...ts.sys, readDirectory: () => [main] };
  const parsed = ts.parseJsonConfigFileContent(parsedJson.config, system, project, undefined, join(project, 'tsconfig.json'));
  const configHost = ts.createCompilerHost(parsed.options, true);
  const base = { fileExists: configHost.fileExists, readFile: configHost.readFile, getSourceFile: configHost.getSourceFile };
  configHost.fileExists = (path) => path === main || base.fileExists.call(configHost, path);
  configHost.readFile = (path) => (path === main ? app : base.readFile.call(configHost, path));
  configHost.getSourceFile = (path, languageVersion, onError, shouldCreate) =>
    path === main
      ? ts.createSourceFile(path, app, languageVersion, true)
      : base.getSourceFile.call(configHost, path, languageVersion, onError, shouldCreate);
  configHost.writeFile = () => undefined;
  const built = ts.createProgram({ rootNames: parsed.fileNames, options: parsed.options, host: configHost });
  const diagnostics = [...parsed.errors, ...ts.getPreEmitDiagnostics(built), ...built.emit().diagnostics];
  return diagnostics.map((diagnostic) => ({
    file: sample.file,
    line: sample.codeLine,
    text: `${at}: this tsconfig.json does not build a NestJS app: error TS${diagnostic.code}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ')}`,
  }));
}

const fileCount = new Set(samples.map((s) => s.file)).size;
if (problems.length > 0) {
  problems.sort((a, b) => a.file.localeCompare(b.file) || a.line - b.line);
  console.error(problems.map((p) => p.text).join('\n'));
  console.error(`\ncheck:docs: ${problems.length} error(s) in the samples of README.md and docs/.`);
  process.exit(1);
}
console.log(
  `check:docs: ${samples.length} TypeScript samples in ${fileCount} files compile; ${tsconfigSamples.length} tsconfig.json sample(s) build.`,
);
