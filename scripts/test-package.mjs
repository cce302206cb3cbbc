// `npm run test:package`: proves the artifact users get, not the source tree.
//
// Packs the package (`npm pack`, whose prepack builds dist afresh), checks what the
// tarball holds (entry points, LICENSE, CHANGELOG, self-contained source maps, no
// sources or tests), installs it into the consumer fixture (test/consumer: its own
// package.json, TypeScript ~6.0, strict, NodeNext ESM, the required peers only: none of
// the optional ones is installed), compiles the fixture, loads the integrations'
// subpaths without their peers, boots the app (the root entry) against PostgreSQL and
// sends an idempotent request and its replay. DATABASE_URL names the database (a schema
// of its own is created and dropped); without it an embedded PostgreSQL server is
// started, as for `npm test`.
//
// Only the npm registry is reached, by the fixture's `npm install`; with a warm npm
// cache (the root's own install) `--prefer-offline` answers from the cache.
/* global fetch, clearTimeout -- Node 20 globals */
import { execFileSync, spawn } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, readFile, rename, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startEmbeddedDatabase } from './embedded-database.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const started = Date.now();
const step = (name) => console.log(`\n== ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
const run = (command, args, cwd) => execFileSync(command, args, { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' });

/** Fails the run with a message that says what the package got wrong. */
function check(condition, message) {
  if (!condition) throw new Error(`test:package: ${message}`);
}

const work = await mkdtemp(join(tmpdir(), 'nest-idempotency-package-'));
let embedded;
let app;
let admin;
let schema;
try {
  step('npm pack (builds dist afresh)');
  const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', work], root));
  const tarball = join(work, 'nest-idempotency-pg.tgz');
  await rename(join(work, packed.filename), tarball);
  const files = packed.files.map((f) => f.path);
  console.log(`${packed.filename}: ${files.length} files, ${(packed.size / 1024).toFixed(0)} kB packed`);
  await checkContents(files, tarball);

  step('install the tarball into the consumer fixture');
  const consumer = join(work, 'app');
  await mkdir(consumer);
  for (const entry of ['package.json', 'tsconfig.json', 'src']) {
    await cp(join(root, 'test', 'consumer', entry), join(consumer, entry), { recursive: true });
  }
  run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], consumer);
  const installed = JSON.parse(await readFile(join(consumer, 'node_modules', 'nest-idempotency-pg', 'package.json'), 'utf8'));
  check(installed.version === packed.version, `the fixture installed ${installed.version}, not the packed ${packed.version}`);
  // The app must run on the required peers alone: no optional peer declared, none installed (npm leaves them out).
  const manifest = JSON.parse(await readFile(join(root, 'package.json'), 'utf8'));
  const optionalPeers = Object.keys(manifest.peerDependenciesMeta).filter((name) => manifest.peerDependenciesMeta[name].optional);
  const fixture = JSON.parse(await readFile(join(consumer, 'package.json'), 'utf8'));
  const declared = optionalPeers.filter((name) => name in { ...fixture.dependencies, ...fixture.devDependencies });
  check(declared.length === 0, `the fixture declares optional peers: ${declared.join(', ')}`);
  for (const optional of optionalPeers) {
    const present = await readdir(join(consumer, 'node_modules', ...optional.split('/'))).then(
      () => true,
      () => false,
    );
    check(!present, `${optional} is an optional peer, yet the fixture got it installed`);
  }
  console.log(`none of the ${optionalPeers.length} optional peers is installed: ${optionalPeers.join(', ')}`);

  step('compile the consumer (TypeScript ~6.0, strict, NodeNext, lib check on)');
  const tsc = join(consumer, 'node_modules', 'typescript', 'bin', 'tsc');
  console.log(run(process.execPath, [tsc, '--version'], consumer).trim());
  run(process.execPath, [tsc, '-p', 'tsconfig.json'], consumer);

  step('load the subpaths without their optional peers');
  const output = run(process.execPath, ['dist/subpaths.js'], consumer);
  const line = output.split('\n').find((l) => l.startsWith('SUBPATHS '));
  check(line, `dist/subpaths.js printed no result:\n${output}`);
  const subpaths = JSON.parse(line.slice('SUBPATHS '.length));
  const loaded = [
    'IdempotencyGraphQLError',
    'IdempotencyHealthIndicator',
    'IdempotencyHealthModule',
    'IdempotencyOpenApiModule',
    'IdempotencyBoardModule',
    'Outbox',
    'OutboxRelay',
    'EffectLedger',
    'IdempotencyStore',
  ];
  check(JSON.stringify(subpaths.loaded) === JSON.stringify(loaded), `the subpaths loaded ${subpaths.loaded}`);
  check(subpaths.openapi && subpaths.fetch === 'function', `the OpenAPI or outbound subpath misbehaved: ${line}`);
  check(subpaths.board === 1, `the board subpath did not mount its controller: ${line}`);
  check(subpaths.pgPool === true, `idempotentPool() of the pg-pool subpath is no pg.Pool: ${line}`);
  check(
    JSON.stringify(subpaths.migrations) === JSON.stringify(['function', 'function']),
    `the outbox or ledger subpath has no migration: ${line}`,
  );
  check(
    /^IdempotencyConfigurationError: IdempotentHttpModule needs @nestjs\/axios and axios: npm i @nestjs\/axios axios/.test(
      subpaths.axios,
    ),
    `IdempotentHttpModule.register() without @nestjs/axios: ${subpaths.axios}`,
  );
  check(
    output.includes('IdempotencyOpenApiModule'),
    `applyIdempotencyToOpenApi did not warn about the missing marks:\n${output}`,
  );
  console.log(
    '/health, /openapi, /graphql, /outbound, /board, /outbox, /ledger and /store load; IdempotentHttpModule says to install @nestjs/axios axios',
  );

  step('boot the app (the root entry, no optional peer) against PostgreSQL');
  let databaseUrl = process.env.DATABASE_URL;
  if (!databaseUrl) {
    embedded = await startEmbeddedDatabase('package');
    databaseUrl = embedded.url;
  }
  schema = `package_consumer_${process.pid}`;
  admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.query(`CREATE SCHEMA "${schema}"`);
  app = await startConsumer(consumer, { DATABASE_URL: databaseUrl, DATABASE_SCHEMA: schema });

  step('an idempotent request and its replay');
  const key = `package-${Date.now()}`;
  const order = { item: 'coffee beans', quantity: 2 };
  const first = await post(app.url, key, order);
  check(first.status === 201, `the first request answered ${first.status}: ${first.body}`);
  check(first.replayed === null, 'the first request carries Idempotent-Replayed');
  const replay = await post(app.url, key, order);
  check(replay.status === 201, `the replay answered ${replay.status}: ${replay.body}`);
  check(replay.replayed === 'true', `the replay's Idempotent-Replayed is ${replay.replayed}`);
  check(replay.body === first.body, `the replay's body differs:\n  ${first.body}\n  ${replay.body}`);
  const mismatch = await post(app.url, key, { ...order, quantity: 3 });
  check(mismatch.status === 422, `the same key with another body answered ${mismatch.status}`);
  const rows = await admin.query(`SELECT count(*)::int AS n FROM "${schema}".orders`);
  check(rows.rows[0].n === 1, `${rows.rows[0].n} orders were inserted, not 1`);
  console.log(`201 ${first.body}\n201 (Idempotent-Replayed: true, same bytes), then 422 for another body; one row`);

  step(`passed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} finally {
  await app?.stop();
  if (admin) {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await admin.end();
  }
  await embedded?.stop();
  if (process.env.KEEP_PACKAGE_TEST) console.log(`kept ${work}`);
  else await rm(work, { recursive: true, force: true });
}

/** What a user's install gets: entry points, legal files, maps that carry their sources, and nothing else. */
async function checkContents(files, tarball) {
  const manifest = JSON.parse(await readFile(join(root, 'package.json'), 'utf8'));
  const has = new Set(files);
  for (const required of ['package.json', 'README.md', 'LICENSE', 'CHANGELOG.md', 'docs/errors.md', 'sql/idempotency-keys.sql']) {
    check(has.has(required), `${required} is not in the package`);
  }
  const targets = [manifest.main, manifest.types];
  for (const entry of Object.values(manifest.exports)) {
    targets.push(...(typeof entry === 'string' ? [entry] : Object.values(entry)));
  }
  for (const target of targets) check(has.has(target.replace(/^\.\//, '')), `${target} (package.json) is not in the package`);
  const strays = files.filter(
    (f) => /^(src|test|sample-app|bench|scripts)\//.test(f) || /\.spec\.|\.tsbuildinfo$|\.tgz$/.test(f),
  );
  check(strays.length === 0, `the package holds files users do not need: ${strays.slice(0, 5).join(', ')}`);

  // Maps are read from the tarball itself, as a user's tools read them.
  const unpacked = join(dirname(tarball), 'unpacked');
  await mkdir(unpacked);
  run('tar', ['-xzf', tarball, '-C', unpacked], root);
  const maps = files.filter((f) => f.endsWith('.js.map'));
  check(maps.length > 0, 'the package has no source maps');
  for (const js of files.filter((f) => f.endsWith('.js'))) {
    const source = await readFile(join(unpacked, 'package', js), 'utf8');
    const reference = /\/\/# sourceMappingURL=(.+)\s*$/.exec(source)?.[1];
    if (reference) check(has.has(join(dirname(js), reference)), `${js} points at ${reference}, which is not in the package`);
  }
  for (const file of maps) {
    const map = JSON.parse(await readFile(join(unpacked, 'package', file), 'utf8'));
    const complete = map.sources.length > 0 && map.sourcesContent?.length === map.sources.length;
    check(
      complete && map.sourcesContent.every((s) => typeof s === 'string' && s.length > 0),
      `${file} does not carry its sources`,
    );
  }
  console.log(`contents: entry points, LICENSE, CHANGELOG; ${maps.length} source maps with their sources inlined`);
}

/** Starts the compiled consumer and resolves once it listens. */
function startConsumer(cwd, env) {
  const child = spawn(process.execPath, ['dist/main.js'], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const exited = new Promise((resolve) => child.once('exit', resolve));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error('the consumer did not listen within 30 s')), 30_000);
    const fail = (error) => {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(new Error(`${error.message}\n${output}`));
    };
    child.stderr.on('data', (chunk) => (output += chunk));
    child.stdout.on('data', (chunk) => {
      output += chunk;
      const url = /LISTENING (\S+)/.exec(output)?.[1];
      if (!url) return;
      clearTimeout(timer);
      resolve({
        url: url.replace('[::1]', '127.0.0.1'),
        stop: async () => {
          child.kill('SIGTERM');
          await exited;
        },
      });
    });
    child.once('exit', (code) => fail(new Error(`the consumer exited (${code}) before listening`)));
  });
}

async function post(url, key, body) {
  const res = await fetch(`${url}/orders`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key, 'X-Tenant': 'package-test' },
    body: JSON.stringify(body),
  });
  return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: await res.text() };
}
