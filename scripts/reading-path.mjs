#!/usr/bin/env node
// How much a reviewer reads to trust one new key: the source files (whole) whose code runs while the library
// answers one new-key request on the bench's module route (HTTP, default claim mode, a handler that inserts a row),
// found with V8's precise coverage rather than by hand, so the count can be repeated on any tree.
//
//   node scripts/reading-path.mjs [--adapter=express|fastify] [--functions] [tree ...]
//   (default: Express, this tree; each tree needs its node_modules)
//
// Each tree's bench is compiled (tsc -p tsconfig.bench.json) and its bench app started on the PostgreSQL of
// DATABASE_URL (else the bench's embedded one) with a coverage hook preloaded. After warm-up requests the counters
// are reset, exactly one new-key request is sent, and every file of src/ with a function or block that ran is
// listed with its line count (`wc -l` of the .ts file). Files that only ran at start-up are not on the path.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL, fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';

const hook = fileURLToPath(new globalThis.URL('./reading-path/coverage-hook.mjs', import.meta.url));
const args = process.argv.slice(2);
/** With --functions, each file's functions that ran are listed under it. */
const listFunctions = args.includes('--functions');
const trees = args.filter((a) => !a.startsWith('--')).length ? args.filter((a) => !a.startsWith('--')) : [process.cwd()];
/**
 * SQL text the request runs inside PostgreSQL (the default mode's key functions and the parts they share), which
 * coverage cannot see: read as well. The request-transaction mode's functions (request-transaction-key.sql.ts) are not.
 */
const SQL_ON_PATH = ['src/store/key-store.sql.ts', 'src/store/key-function-parts.sql.ts'];
/** --adapter=express|fastify (default express). */
const adapter = args.find((a) => a.startsWith('--adapter='))?.slice('--adapter='.length) ?? 'express';

for (const tree of trees.map((t) => resolve(t))) {
  const files = await pathFiles(tree);
  const total = files.reduce((sum, f) => sum + f.lines, 0);
  const ran = files.reduce((sum, f) => sum + (f.ranLines ?? 0), 0);
  console.log(`\n${tree} (${adapter}): ${files.length} files, ${total} lines on one new key's path`);
  console.log(`  of which ${ran} lines of code ran (compiled JavaScript, comments and blank lines left out; SQL not counted)`);
  for (const f of files) {
    console.log(`  ${String(f.lines).padStart(5)}  ${String(f.ranLines ?? '-').padStart(5)} ran  ${f.path}`);
    if (listFunctions && f.functions.length) console.log(`           ${f.functions.join(', ')}`);
  }
}

async function pathFiles(tree) {
  // The bench's Prisma route needs its generated client before the bench compiles.
  execFileSync('node', ['scripts/prisma-generate.mjs'], { cwd: tree, stdio: 'inherit' });
  execFileSync('npx', ['tsc', '-p', 'tsconfig.bench.json'], { cwd: tree, stdio: 'inherit' });
  const dist = join(tree, 'dist-bench');
  const { AppProcess } = await import(pathToFileURL(join(dist, 'bench/app-process.js')).href);
  const { VARIANTS, BODY } = await import(pathToFileURL(join(dist, 'bench/http-scenarios.js')).href);
  const { loadConfig } = await import(pathToFileURL(join(dist, 'bench/config.js')).href);
  const { openDatabase, resetSchema } = await import(pathToFileURL(join(dist, 'bench/database.js')).href);
  const config = loadConfig();
  const out = join(mkdtempSync(join(tmpdir(), 'reading-path-')), 'coverage');
  process.env.BENCH_APP_NODE_ARGS = `--import=${hook}`;
  process.env.READING_PATH_COVERAGE_FILE = out;
  const database = await openDatabase(() => undefined);
  let app;
  try {
    await resetSchema(database.url, config.schema);
    app = await AppProcess.start({ adapter, databaseUrl: database.url, schema: config.schema, poolSize: config.poolSize });
    const send = async () => {
      const response = await globalThis.fetch(`${app.url}${VARIANTS.module.path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
        body: BODY,
      });
      await response.arrayBuffer();
      if (response.status >= 300) throw new Error(`The module route answered ${response.status}.`);
    };
    for (let i = 0; i < 20; i++) await send();
    const pid = app.child.pid;
    const take = async (n) => {
      process.kill(pid, 'SIGUSR2');
      for (let i = 0; i < 200 && !existsSync(`${out}.${n}.json`); i++) await sleep(25);
      await sleep(100);
      return JSON.parse(readFileSync(`${out}.${n}.json`, 'utf8'));
    };
    await take(0);
    await send();
    const coverage = await take(1);
    const ran = new Map();
    for (const script of coverage) {
      if (!script.url.startsWith('file://')) continue;
      const file = fileURLToPath(script.url);
      const inSrc = relative(join(dist, 'src'), file);
      if (inSrc.startsWith('..') || !inSrc.endsWith('.js')) continue;
      const functions = script.functions.filter((fn) => fn.ranges[0].count > 0).map((fn) => fn.functionName || '(anonymous)');
      if (script.functions.some((fn) => fn.ranges.some((range) => range.count > 0)))
        ran.set(`src/${inSrc.replace(/\.js$/, '.ts')}`, {
          functions,
          ranLines: linesThatRan(readFileSync(file, 'utf8'), script.functions),
        });
    }
    for (const path of SQL_ON_PATH)
      if (existsSync(join(tree, path))) ran.set(path, { functions: ['(SQL functions run by PostgreSQL)'], ranLines: undefined });
    return [...ran]
      .map(([path, { functions, ranLines }]) => ({
        path,
        functions,
        ranLines,
        lines: readFileSync(join(tree, path), 'utf8').split('\n').length - 1,
      }))
      .sort((a, b) => b.lines - a.lines);
  } finally {
    await app?.close();
    await database.stop();
  }
}

/**
 * The lines of compiled code that ran: a floor under what a reviewer reads, whatever the files' layout. V8's block
 * coverage nests ranges, the innermost deciding an offset's count; a line counts when a character of its code (not
 * of a comment) ran. The module's top level ran at start-up, before the counters were reset, and does not count.
 */
function linesThatRan(source, functions) {
  const counts = new Int32Array(source.length).fill(-1);
  // Outer ranges first, so inner ones overwrite them.
  const ranges = functions.flatMap((fn) => fn.ranges).sort((a, b) => a.startOffset - b.startOffset || b.endOffset - a.endOffset);
  for (const range of ranges) counts.fill(range.count, range.startOffset, Math.min(range.endOffset, source.length));
  let lines = 0;
  let offset = 0;
  let inComment = false;
  for (const line of source.split('\n')) {
    let code = false;
    for (let i = 0; i < line.length; i++) {
      const at = offset + i;
      if (inComment) {
        if (line.startsWith('*/', i)) {
          inComment = false;
          i++;
        }
        continue;
      }
      if (line.startsWith('/*', i)) {
        inComment = true;
        i++;
        continue;
      }
      if (line.startsWith('//', i)) break;
      if (!/\s/.test(line[i]) && counts[at] > 0) code = true;
    }
    if (code) lines++;
    offset += line.length + 1;
  }
  return lines;
}
