// Plain JavaScript: this runs before anything is compiled.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, utimes } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

export const REPOSITORY_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE_DIRECTORIES = ['sample-app', 'src'];
/** Everything else the compiler's output depends on; this script is among them, as it passes the options. */
const CONFIG_FILES = ['tsconfig.json', 'tsconfig.sample.json', 'package-lock.json', 'sample-app/build.mjs'];
const SOURCE_FILE = /\.(m|c)?tsx?$/;
const SPEC_FILE = /\.spec\.(m|c)?tsx?$/;
const BUILD_NAME = /^[0-9a-f]{16}$/;
const STAGING_PREFIX = '.staging-';
/** A build nobody started for this long is removed; every module a process loads is loaded at start, long before. */
const UNUSED_BUILD_MAX_AGE_MS = 24 * 60 * 60 * 1000;
/** A staging directory this old belongs to a build that died (Ctrl-C during tsc). */
const ABANDONED_STAGING_MAX_AGE_MS = 60 * 60 * 1000;

/**
 * Compiles the sample app for `npm run sample` and returns the path of its
 * `main.js`, safely when several instances start at once.
 *
 * Each build goes to a directory named after a hash of its inputs (the
 * sources and the compiler configuration). tsc writes into a private staging
 * directory, which is then renamed into place: a rename is atomic, so a
 * build directory either does not exist or is complete, and nothing ever
 * writes into one that exists. An instance whose sources are unchanged skips
 * tsc; instances racing on a new build each compile, the first rename wins,
 * and the others use the winner's identical output.
 *
 * The output stays inside the repository (default `dist-sample/`), where
 * Node finds `package.json` (`"type": "module"`) and `node_modules`.
 *
 * @param {object} [options]
 * @param {string} [options.outDir] where builds go, default `<repo>/dist-sample`
 * @param {(stagingDir: string) => Promise<void>} [options.compile] writes the
 *   compiled app into `stagingDir`, default `tsc -p tsconfig.sample.json`
 * @param {(line: string) => void} [options.log]
 * @returns {Promise<{ main: string, buildDir: string, compiled: boolean }>}
 */
export async function buildSampleApp(options = {}) {
  const outDir = resolve(REPOSITORY_ROOT, options.outDir ?? 'dist-sample');
  const compile = options.compile ?? compileWithTsc;
  const log = options.log ?? (() => undefined);
  const buildDir = join(outDir, await inputsHash());
  const main = join(buildDir, 'sample-app', 'main.js');

  let compiled = false;
  if (!existsSync(buildDir)) {
    await mkdir(outDir, { recursive: true });
    const staging = await mkdtemp(join(outDir, STAGING_PREFIX));
    try {
      log(`Compiling the sample app into ${relative(REPOSITORY_ROOT, buildDir)}/ ...`);
      await compile(staging);
      // mkdtemp makes it private (0700); a build is as readable as any other output.
      await chmod(staging, 0o755);
      compiled = await moveIntoPlace(staging, buildDir);
    } finally {
      await rm(staging, { recursive: true, force: true });
    }
  }
  if (!existsSync(main)) throw new Error(`The sample app's build ${buildDir} has no sample-app/main.js.`);
  // Marks the build as in use, so pruning by another instance leaves it alone.
  const now = new Date();
  await utimes(buildDir, now, now);
  await pruneOldBuilds(outDir, buildDir);
  return { main, buildDir, compiled };
}

/** True if this build's rename made it the one in place; false if an identical one got there first. */
async function moveIntoPlace(staging, buildDir) {
  try {
    await rename(staging, buildDir);
    return true;
  } catch (error) {
    // ENOTEMPTY/EEXIST on POSIX, EPERM on Windows: the directory exists, complete, from a concurrent build.
    if (['ENOTEMPTY', 'EEXIST', 'EPERM'].includes(error?.code) && existsSync(buildDir)) return false;
    throw error;
  }
}

async function compileWithTsc(stagingDir) {
  const tsc = join(REPOSITORY_ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
  try {
    await promisify(execFile)(process.execPath, [tsc, '-p', 'tsconfig.sample.json', '--outDir', stagingDir], {
      cwd: REPOSITORY_ROOT,
      maxBuffer: 16 * 1024 * 1024,
    });
  } catch (error) {
    const output = `${error.stdout ?? ''}${error.stderr ?? ''}`.trim();
    throw new Error(`Compiling the sample app (tsc -p tsconfig.sample.json) failed:\n${output || error.message}`, {
      cause: error,
    });
  }
}

/** The first 16 hex digits of a SHA-256 over every input's path and content, in a stable order. */
async function inputsHash() {
  const files = [...CONFIG_FILES];
  for (const directory of SOURCE_DIRECTORIES) {
    const entries = await readdir(join(REPOSITORY_ROOT, directory), { recursive: true, withFileTypes: true });
    for (const entry of entries) {
      if (!entry.isFile() || !SOURCE_FILE.test(entry.name) || SPEC_FILE.test(entry.name)) continue;
      // `parentPath` from Node 20.12, `path` before.
      const parent = entry.parentPath ?? entry.path;
      files.push(relative(REPOSITORY_ROOT, join(parent, entry.name)).split('\\').join('/'));
    }
  }
  files.sort();
  const hash = createHash('sha256');
  for (const file of files) {
    const content = await readFile(join(REPOSITORY_ROOT, file)).catch((error) => {
      if (error.code === 'ENOENT') return Buffer.alloc(0);
      throw error;
    });
    hash.update(`${file}\0${content.length}\0`).update(content);
  }
  return hash.digest('hex').slice(0, 16);
}

/** Removes builds unused for a day and staging directories abandoned for an hour; never the one in use. */
async function pruneOldBuilds(outDir, keep) {
  const now = Date.now();
  for (const name of await readdir(outDir)) {
    const path = join(outDir, name);
    const maxAge = BUILD_NAME.test(name)
      ? UNUSED_BUILD_MAX_AGE_MS
      : name.startsWith(STAGING_PREFIX)
        ? ABANDONED_STAGING_MAX_AGE_MS
        : undefined;
    if (maxAge === undefined || path === keep) continue;
    const modified = await stat(path).then(
      (info) => info.mtimeMs,
      () => now,
    );
    if (now - modified > maxAge) await rm(path, { recursive: true, force: true });
  }
}

// `node sample-app/build.mjs` builds and prints the path of main.js (the reliability suite's global setup uses it).
if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  buildSampleApp({ outDir: process.env.SAMPLE_BUILD_DIR, log: (line) => console.error(line) }).then(
    ({ main }) => console.log(main),
    (error) => {
      console.error(error instanceof Error ? error.message : String(error));
      process.exit(1);
    },
  );
}
