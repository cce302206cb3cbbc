// `npm run test:quick-start`: the README's Install and Quick start, followed as a new user follows them.
//
// In a fresh temporary directory: `npm init -y`; the shell lines of the README's "## Install"
// block and of the Quick start's setup block, as written, with the package's name replaced by
// the tarball `npm pack` makes of this repository (its prepack builds dist afresh; every other
// package comes from the npm registry); the Quick start's TypeScript block saved verbatim under
// the name the README gives it; docs/tsconfig.md's tsconfig saved verbatim as tsconfig.json;
// then the Quick start's own commands: `npx tsc`, the app started as the README starts it (with
// DATABASE_URL naming a fresh database of its own, and a free port in place of 3000), and the
// README's curl sent twice, each answer compared with what the README shows. A request with
// another body under the key and one without a key must get the 422 and 400 the README names.
//
// DATABASE_URL names the server (a database of its own is created and dropped); without it an
// embedded PostgreSQL server is started, as for `npm test`. QUICK_START_README reads another
// README (to check this test fails on a broken one); KEEP_QUICK_START keeps the directory.
/* global fetch, URL -- Node 20 globals */
import { execFileSync, spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startEmbeddedDatabase } from './embedded-database.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const PACKAGE = 'nest-idempotency-pg';
const started = Date.now();
const step = (name) => console.log(`\n== ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);

/** Fails the run with a message that says which step of the README does not hold. */
function check(condition, message) {
  if (!condition) throw new Error(`test:quick-start: ${message}`);
}

// What npm does for a user, minus what only slows a test down; `npx` never fetches a package
// (a missing `typescript` must fail here, not install the unrelated `tsc`).
const npmEnv = {
  npm_config_audit: 'false',
  npm_config_fund: 'false',
  npm_config_prefer_offline: 'true',
  npm_config_update_notifier: 'false',
  npm_config_yes: 'false',
};

/** Runs one of the README's shell lines as a user would, showing it and its output. */
function shell(line, cwd, extraEnv = {}) {
  console.log(`$ ${line}`);
  try {
    const out = execFileSync('bash', ['-c', line], {
      cwd,
      env: { ...process.env, ...npmEnv, ...extraEnv },
      stdio: ['ignore', 'pipe', 'pipe'],
      encoding: 'utf8',
    });
    return out;
  } catch (error) {
    throw new Error(`test:quick-start: \`${line}\` failed (exit ${error.status}):\n${error.stdout ?? ''}${error.stderr ?? ''}`, {
      cause: error,
    });
  }
}

// ---- What the docs say, read from them ----

const readmePath = resolve(process.env.QUICK_START_README ?? join(root, 'README.md'));
const readme = await readFile(readmePath, 'utf8');
const tsconfigDoc = await readFile(join(root, 'docs', 'tsconfig.md'), 'utf8');

/** The text under a `## ` heading, up to the next one. */
function section(markdown, heading) {
  const start = markdown.indexOf(`\n## ${heading}\n`);
  check(start >= 0, `${readmePath} has no "## ${heading}" section`);
  const end = markdown.indexOf('\n## ', start + 1);
  return markdown.slice(start, end < 0 ? undefined : end);
}

/** The fenced blocks of a Markdown text, in order, with the prose before each. */
function blocks(markdown) {
  const found = [];
  const fence = /^```(\w*)\n([\s\S]*?)^```$/gm;
  let last = 0;
  for (let m; (m = fence.exec(markdown));) {
    found.push({ lang: m[1], code: m[2], before: markdown.slice(last, m.index) });
    last = fence.lastIndex;
  }
  return found;
}

/** A bash block's commands: comments dropped, `\` continuations joined. */
function commands(code) {
  const lines = [];
  let pending = '';
  for (const raw of code.split('\n')) {
    if (/^\s*#/.test(raw) || raw.trim() === '') continue;
    const line = pending + raw;
    if (line.endsWith('\\')) pending = `${line.slice(0, -1)} `;
    else {
      lines.push(line.replace(/\s+#\s.*$/, '').trim());
      pending = '';
    }
  }
  return lines;
}

const install = blocks(section(readme, 'Install')).filter((b) => b.lang === 'bash');
check(install.length > 0, 'the Install section has no ```bash block');
const installLines = install.flatMap((b) => commands(b.code));

const quickStart = blocks(section(readme, 'Quick start'));
const tsIndex = quickStart.findIndex((b) => b.lang === 'ts');
check(tsIndex >= 0, 'the Quick start has no ```ts block');
const setupLines = quickStart
  .slice(0, tsIndex)
  .filter((b) => b.lang === 'bash')
  .flatMap((b) => commands(b.code));
const sourceName = /as `([\w./-]+\.ts)`/.exec(quickStart[tsIndex].before)?.[1];
check(sourceName, 'the Quick start does not say which file its block is saved as (e.g. "save this block as `src/main.ts`")');
const runBlock = quickStart.slice(tsIndex + 1).find((b) => b.lang === 'bash' && /\bcurl\b/.test(b.code));
check(runBlock, 'the Quick start has no ```bash block with its requests after the TypeScript block');
const runLines = commands(runBlock.code);
const startIndex = runLines.findIndex((line) => /\bnode\s+\S+\.js\b/.test(line));
check(startIndex >= 0, "the Quick start's commands never start the app (`node dist/...js`)");
const buildLines = runLines.slice(0, startIndex);
const startLine = runLines[startIndex];
const curlLines = runLines.slice(startIndex + 1).filter((line) => line.startsWith('curl '));
check(curlLines.length === 1, `the Quick start shows ${curlLines.length} curl commands, this test knows one`);
// What the README shows the answer to be: `# HTTP/1.1 201 Created`, then the body.
const shown = runBlock.code
  .split('\n')
  .filter((line) => line.startsWith('# '))
  .map((line) => line.slice(2));
const shownStatus = shown.find((line) => /^HTTP\/\S+ \d{3}/.test(line));
const shownBody = shown.find((line) => line.startsWith('{'));
check(shownStatus && shownBody, 'the Quick start does not show the answer (`# HTTP/1.1 ...` and the body)');
check(/Idempotent-Replayed: true/.test(runBlock.code), 'the Quick start does not show the replay header');

const tsconfigBlock = blocks(tsconfigDoc).find((b) => b.lang === 'json' && b.code.includes('"compilerOptions"'));
check(tsconfigBlock, 'docs/tsconfig.md has no tsconfig.json block');

// ---- Following them ----

const work = await mkdtemp(join(tmpdir(), 'nest-idempotency-quick-start-'));
const project = join(work, 'app');
let embedded;
let app;
let admin;
const database = `quick_start_${process.pid}`;
try {
  step('npm pack (builds dist afresh)');
  const [packed] = JSON.parse(
    execFileSync('npm', ['pack', '--json', '--pack-destination', work], {
      cwd: root,
      stdio: ['ignore', 'pipe', 'inherit'],
      encoding: 'utf8',
    }),
  );
  const tarball = join(work, `${PACKAGE}.tgz`);
  await rename(join(work, packed.filename), tarball);
  console.log(`${packed.filename} -> ${tarball}`);

  step('a new project: npm init -y');
  await mkdir(project);
  shell('npm init -y', project);

  step("the README's Install lines (the packed tarball in place of the registry's package)");
  const packageWord = new RegExp(`(^|\\s)${PACKAGE}(?=\\s|$)`, 'g');
  for (const line of installLines) {
    check(/^npm (i|install)\b/.test(line), `an Install line this test does not know how to run: ${line}`);
    shell(line.replace(packageWord, `$1${tarball}`), project);
  }
  const installed = JSON.parse(await readFile(join(project, 'node_modules', PACKAGE, 'package.json'), 'utf8'));
  check(
    installed.version === packed.version,
    `the project got ${PACKAGE} ${installed.version}, not the packed ${packed.version}`,
  );
  const hasTypeScript = await stat(join(project, 'node_modules', 'typescript', 'package.json')).then(
    () => true,
    () => false,
  );
  check(hasTypeScript, 'the Install lines do not install typescript: `npx tsc` would offer the unrelated package `tsc`');

  step("the Quick start's setup, its block and the docs' tsconfig");
  for (const line of setupLines) shell(line, project);
  await mkdir(dirname(join(project, sourceName)), { recursive: true });
  await writeFile(join(project, sourceName), quickStart[tsIndex].code);
  await writeFile(join(project, 'tsconfig.json'), tsconfigBlock.code);
  const manifest = JSON.parse(await readFile(join(project, 'package.json'), 'utf8'));
  console.log(
    `${sourceName} (${quickStart[tsIndex].code.split('\n').length - 1} lines), tsconfig.json; package.json "type": ${JSON.stringify(manifest.type)}`,
  );

  step('compile, as the Quick start says');
  check(buildLines.length > 0, 'the Quick start never says how to compile (`npx tsc`) before starting the app');
  for (const line of buildLines) shell(line, project);
  console.log(shell('npx tsc --version', project).trim());

  step('start the app as the Quick start does, on a database of its own');
  let serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    embedded = await startEmbeddedDatabase('quickstart');
    serverUrl = embedded.url;
  }
  admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
  await admin.query(`CREATE DATABASE "${database}"`);
  const databaseUrl = new URL(serverUrl);
  databaseUrl.pathname = `/${database}`;
  const port = await freePort();
  // `DATABASE_URL=... node dist/main.js`: the README's command, with this test's database and port.
  const command = startLine.replace(/^(\w+=\S+\s+)+/, '');
  console.log(`$ ${startLine}\n  (DATABASE_URL=${databaseUrl.href.replace(/:[^:@/]+@/, ':***@')} PORT=${port} ${command})`);
  app = await startApp(command, project, { DATABASE_URL: databaseUrl.href, PORT: String(port) });

  step("the README's request, and the same command again");
  const curl = curlLines[0].replace(/\blocalhost:3000\b/g, `localhost:${port}`);
  const first = parseCurl(shell(curl, project));
  console.log(`${first.statusLine}\n${first.body}`);
  check(
    first.statusLine === shownStatus,
    `the first answer is "${first.statusLine}", the README shows "${shownStatus}":\n${first.body}\n${app.output()}`,
  );
  check(first.body === shownBody, `the first answer's body is ${first.body}, the README shows ${shownBody}`);
  check(!('idempotent-replayed' in first.headers), 'the first answer carries Idempotent-Replayed');
  const again = parseCurl(shell(curl, project));
  console.log(`${again.statusLine}\nIdempotent-Replayed: ${again.headers['idempotent-replayed']}\n${again.body}`);
  check(again.statusLine === shownStatus, `the same command again answered "${again.statusLine}", not "${shownStatus}"`);
  check(
    again.headers['idempotent-replayed'] === 'true',
    `the replay's Idempotent-Replayed is ${again.headers['idempotent-replayed']}`,
  );
  check(again.body === first.body, `the replay's body differs:\n  ${first.body}\n  ${again.body}`);
  const rows = new pg.Client({ connectionString: databaseUrl.href });
  await rows.connect();
  const count = (await rows.query('SELECT count(*)::int AS n FROM charges')).rows[0].n;
  await rows.end();
  check(count === 1, `${count} rows in charges after the same command twice, the README says one`);
  console.log('still one row in charges');

  step('the same key with another body (422), a request without a key (400)');
  const key = /Idempotency-Key: ([^'"]+)/.exec(curl)?.[1];
  const body = /-d '([^']*)'/.exec(curl)?.[1];
  check(key && body, `cannot read the key and body of the README's curl: ${curl}`);
  const other = await post(port, key, JSON.stringify({ ...JSON.parse(body), amount: 1 }));
  check(other.status === 422, `the same key with another body answered ${other.status}, the README says 422`);
  const keyless = await post(port, undefined, body);
  check(keyless.status === 400, `a request without a key answered ${keyless.status}, the README says 400`);
  console.log('422, 400');

  step(`passed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} finally {
  await app?.stop();
  if (admin) {
    await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`).catch(() => undefined);
    await admin.end();
  }
  await embedded?.stop();
  if (process.env.KEEP_QUICK_START) console.log(`kept ${work}`);
  else await rm(work, { recursive: true, force: true });
}

/** `curl -i`'s output: the status line, the headers (lower-cased names) and the body. */
function parseCurl(output) {
  const [head, ...rest] = output.split(/\r?\n\r?\n/);
  const [statusLine, ...headerLines] = head.split(/\r?\n/);
  const headers = Object.fromEntries(
    headerLines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
  );
  return { statusLine: statusLine.trim(), headers, body: rest.join('\n\n') };
}

async function post(port, key, body) {
  const res = await fetch(`http://localhost:${port}/charges`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}) },
    body,
  });
  await res.arrayBuffer();
  return { status: res.status };
}

async function freePort() {
  const server = createServer();
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address();
  await new Promise((done) => server.close(done));
  return port;
}

/** Starts the README's command and resolves once the port answers. */
async function startApp(command, cwd, env) {
  const child = spawn('bash', ['-c', `exec ${command}`], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.setEncoding('utf8').on('data', (chunk) => (output += chunk));
  child.stderr.setEncoding('utf8').on('data', (chunk) => (output += chunk));
  const exited = new Promise((done) => child.once('exit', done));
  const handle = {
    output: () => `--- the app's output ---\n${output}`,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`test:quick-start: the app exited (${child.exitCode ?? child.signalCode}) before listening:\n${output}`);
    }
    if (Date.now() > deadline) {
      await handle.stop();
      throw new Error(`test:quick-start: the app did not listen within 60 s:\n${output}`);
    }
    const up = await fetch(`http://localhost:${env.PORT}/`).then(
      () => true,
      () => false,
    );
    if (up) return handle;
    await new Promise((done) => setTimeout(done, 200));
  }
}
