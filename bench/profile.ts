/**
 * Where a request's CPU goes, route against route: `npm run bench:profile`.
 *
 * For each adapter it starts the bench app, warms every route, then loads one
 * route at a time (a new key per request, or completed keys replayed) with
 * the V8 profiler running in the app for that load only. It prints, per
 * route, the requests served and the CPU per request of the app and of its
 * PostgreSQL backends, then the app's CPU per request by where it was spent
 * (the module's files, each package, Node's own modules, native code) for
 * each route, and the difference of each route from the first. Profiles are
 * kept as `.cpuprofile` files (Chrome DevTools opens them).
 *
 * Env: BENCH_ADAPTERS, BENCH_PROFILE_ROUTES (variant names of the bench,
 * default `bare,module,floor,replay`), BENCH_PROFILE_SECONDS (8),
 * BENCH_CONNECTIONS (16), BENCH_PROFILE_DIR (bench/results/profiles),
 * DATABASE_URL (else an embedded PostgreSQL), BENCH_SCHEMA, BENCH_COUNT_PROMISES=1
 * (the promises the app creates per request, a count the machine's load does
 * not move; the counting hook makes that run's CPU figures read high).
 */
import { randomUUID } from 'node:crypto';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AppProcess } from './app-process.js';
import { loadConfig } from './config.js';
import { BackendCpu, connect, openDatabase, resetSchema, vacuumAnalyze } from './database.js';
import { bigBody, BODY, createCompletedKeys, cpuNow, cpuSince, VARIANTS, type VariantName } from './http-scenarios.js';
import { runLoad } from './load.js';
import { APP_APPLICATION_NAME } from './protocol.js';

interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string }; children?: number[] }>;
  samples: number[];
  timeDeltas: number[];
}

interface RouteProfile {
  route: VariantName;
  requests: number;
  rps: number;
  appMicrosPerRequest: number;
  postgresMicrosPerRequest: number | null;
  /** Promises the app created per request, with BENCH_COUNT_PROMISES=1. */
  promisesPerRequest?: number;
  /** Self time per request (µs) by place: `src/...` files, `pkg:<name>`, `node:<module>`, `(native) <name>`. */
  places: Map<string, number>;
}

async function main(): Promise<void> {
  const config = loadConfig();
  const routes = (process.env.BENCH_PROFILE_ROUTES ?? 'bare,module,floor,replay').split(',') as VariantName[];
  for (const route of routes) if (!VARIANTS[route]) throw new Error(`BENCH_PROFILE_ROUTES: no route "${route}".`);
  const seconds = Number(process.env.BENCH_PROFILE_SECONDS ?? 8);
  const dir = process.env.BENCH_PROFILE_DIR ?? 'bench/results/profiles';
  await mkdir(dir, { recursive: true });
  const database = await openDatabase((line) => console.log(line));
  try {
    await resetSchema(database.url, config.schema);
    const db = await connect(database.url, config.schema);
    try {
      for (const adapter of config.adapters) {
        const app = await AppProcess.start({
          adapter,
          databaseUrl: database.url,
          schema: config.schema,
          poolSize: config.poolSize,
        });
        try {
          const cpu = new BackendCpu(db, APP_APPLICATION_NAME);
          const replayKeys = await createCompletedKeys(app, config, `profile-${randomUUID()}`);
          const memoryKeys = routes.includes('replayFromMemory')
            ? await createCompletedKeys(app, config, `profile-memory-${randomUUID()}`, VARIANTS.replayFromMemory.path)
            : [];
          const floorKeys = routes.includes('floorReplay')
            ? await createCompletedKeys(app, config, `profile-floor-${randomUUID()}`, VARIANTS.floorReplay.path)
            : [];
          const floorMemoryKeys = routes.includes('floorReplayFromMemory')
            ? await createCompletedKeys(app, config, `profile-floor-memory-${randomUUID()}`, VARIANTS.floorReplayFromMemory.path)
            : [];
          await vacuumAnalyze(db);
          let replayIndex = 0;
          const keysOf = (route: VariantName) =>
            ({ new: [], replay: replayKeys, memory: memoryKeys, floor: floorKeys, floorMemory: floorMemoryKeys })[
              VARIANTS[route].keys
            ];
          const big = routes.some((route) => VARIANTS[route].body === 'big') ? bigBody(config.bigBodyBytes) : undefined;
          // The big-body routes as the bench loads them: the ~1 MiB body, with the bench's connections for it.
          const loadOf = (route: VariantName) => ({
            url: app.url,
            path: VARIANTS[route].path,
            body: VARIANTS[route].body === 'big' ? big! : BODY,
            connections: VARIANTS[route].body === 'big' ? config.bigBodyConnections : config.connections,
            key: VARIANTS[route].keys === 'new' ? () => randomUUID() : () => keysOf(route)[replayIndex++ % keysOf(route).length],
          });
          for (const route of routes) await runLoad({ ...loadOf(route), seconds: 3 });
          const results: RouteProfile[] = [];
          for (const route of routes) {
            const file = join(dir, `${adapter}-${route}.cpuprofile`);
            await runLoad({ ...loadOf(route), seconds: 1 });
            const before = await cpuNow(app, cpu);
            const promisesBefore = await app.promisesCreated();
            await app.profileStart();
            const run = await runLoad({ ...loadOf(route), seconds });
            await app.profileStop(file);
            const spent = await cpuSince(app, cpu, before);
            const promisesAfter = await app.promisesCreated();
            const profile = JSON.parse(await readFile(file, 'utf8')) as CpuProfile;
            results.push({
              route,
              requests: run.requests,
              rps: run.rps,
              appMicrosPerRequest: spent.app / run.requests,
              postgresMicrosPerRequest: spent.postgres === null ? null : spent.postgres / run.requests,
              promisesPerRequest:
                promisesBefore === undefined || promisesAfter === undefined
                  ? undefined
                  : (promisesAfter - promisesBefore) / run.requests,
              places: selfTimeByPlace(profile, run.requests),
            });
            console.log(`${adapter} ${route}: ${run.rps} req/s, statuses ${JSON.stringify(run.statuses)}, profile ${file}`);
          }
          report(adapter, results);
        } finally {
          await app.close();
        }
      }
    } finally {
      await db.end();
    }
  } finally {
    await database.stop();
  }
}

/** Self time per request (µs) of each place code runs in. */
function selfTimeByPlace(profile: CpuProfile, requests: number): Map<string, number> {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const places = new Map<string, number>();
  profile.samples.forEach((id, i) => {
    const place = placeOf(byId.get(id)!.callFrame);
    places.set(place, (places.get(place) ?? 0) + (profile.timeDeltas[i] ?? 0));
  });
  for (const [place, micros] of places) places.set(place, micros / requests);
  return places;
}

function placeOf({ url, functionName }: { url: string; functionName: string }): string {
  if (!url) return `(native) ${functionName || '(anonymous)'}`;
  const inPackage = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (inPackage) return `pkg:${inPackage[1]}`;
  const own = /\/(src|bench)\/(.+)$/.exec(url);
  if (own) return `${own[1]}/${own[2]}`;
  return url;
}

function report(adapter: string, results: RouteProfile[]): void {
  const fmt = (n: number) => n.toFixed(0).padStart(7);
  console.log(`\n## ${adapter}: CPU per request (µs)\n`);
  const counted = results.some((r) => r.promisesPerRequest !== undefined);
  console.log(
    `| route | req/s | app | PostgreSQL |${counted ? ' promises |' : ''}\n| --- | --- | --- | --- |${counted ? ' --- |' : ''}`,
  );
  for (const r of results) {
    const promises = counted ? ` ${r.promisesPerRequest?.toFixed(1) ?? '-'} |` : '';
    console.log(
      `| ${r.route} | ${r.rps} | ${fmt(r.appMicrosPerRequest)} | ${r.postgresMicrosPerRequest === null ? '-' : fmt(r.postgresMicrosPerRequest)} |${promises}`,
    );
  }
  const [base, ...others] = results;
  for (const r of others) {
    const places = new Set([...r.places.keys(), ...base.places.keys()]);
    const diff = [...places].map((p) => [p, (r.places.get(p) ?? 0) - (base.places.get(p) ?? 0), r.places.get(p) ?? 0] as const);
    diff.sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
    console.log(
      `\n### ${adapter}: ${r.route} against ${base.route}, app self time per request (µs), the 30 largest differences\n`,
    );
    console.log(`| place | ${r.route} - ${base.route} | ${r.route} |\n| --- | --- | --- |`);
    for (const [place, delta, total] of diff.slice(0, 30)) console.log(`| ${place} | ${fmt(delta)} | ${fmt(total)} |`);
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
