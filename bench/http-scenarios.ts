import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { AppProcess, SlowService } from './app-process.js';
import type { AdapterName, BenchConfig } from './config.js';
import {
  BackendCpu,
  BENCH_CUSTOMER,
  CHARGES_TABLE,
  KeyTableUpdateCounter,
  truncateAll,
  vacuumAnalyze,
  type KeyTableUpdates,
  type WalCounter,
  type WalSpent,
} from './database.js';
import { runAtRate, runLoad, unexpectedStatuses, type LoadResult, type LoadRun } from './load.js';
import { APP_APPLICATION_NAME, type PoolPeak } from './protocol.js';
import { median, round, summarize, type LatencySummary } from './stats.js';

/** Same request body everywhere, so every route parses and fingerprints the same bytes. */
const CHARGE = { amount: 1999, currency: 'usd', customer: BENCH_CUSTOMER, description: 'Benchmark charge' };
export const BODY = JSON.stringify(CHARGE);

export type VariantName =
  | 'bare'
  | 'module'
  | 'floor'
  | 'floorAsyncClaim'
  | 'floorFiveRoundTrips'
  | 'floorPrepared'
  | 'replay'
  | 'replayFromMemory'
  | 'floorReplay'
  | 'floorReplayFromMemory'
  | 'nodb'
  | 'requestTransaction'
  | 'floorRequestTransaction'
  | 'realisticBare'
  | 'realisticModule'
  | 'bigBodyBare'
  | 'bigBodyModule'
  | 'bareAtPeer'
  | 'moduleAtPeer'
  | 'floorAtPeer'
  | LayerVariantName;
/** Scenario 15's: the same write through each data layer of issue 29, without and with `@Idempotent()`. */
export const LAYER_VARIANTS = ['prismaBare', 'prismaModule', 'drizzleBare', 'drizzleModule'] as const;
export type LayerVariantName = (typeof LAYER_VARIANTS)[number];
/**
 * What scenarios 1-4 and 7-12 measure: all but the floor with an asynchronous claim commit, which only durable commits
 * tell apart, and the data layers', which have their group (`layers`).
 */
export type MainVariantName = Exclude<VariantName, 'floorAsyncClaim' | LayerVariantName>;

/**
 * The steady-load variants; each request carries an Idempotency-Key so all
 * send the same bytes. `body: 'big'` sends scenario 11's ~1 MiB body instead
 * of the small charge (with `bigBodyConnections`); `connections: 'peer'` runs
 * at `peerConnections` (scenario 12) rather than `connections`.
 */
interface Variant {
  path: string;
  /**
   * `replay`: keys completed before the run; `memory`: the same, completed on the replayFromMemory route; `floor`:
   * completed on the hand-written floor's route; `floorMemory`: on the hand-written replay from memory's.
   */
  keys: 'new' | 'replay' | 'memory' | 'floor' | 'floorMemory';
  body?: 'big';
  connections?: 'peer';
  what: string;
}
export const VARIANTS: Record<VariantName, Variant> = {
  bare: { path: '/bare/charges', keys: 'new', what: 'handler opens its own TypeORM transaction, no module' },
  module: { path: '/idem/charges', keys: 'new', what: '@Idempotent(), a new key per request' },
  floor: {
    path: '/floor/charges',
    keys: 'new',
    what: "the module's protocol hand-written on pg (the store's statements pipelined as it sends them, 3 round trips, a durable claim)",
  },
  floorAsyncClaim: {
    path: '/floor-async-claim/charges',
    keys: 'new',
    what: "the 3-round-trip floor with the claim committed asynchronously (synchronous_commit off: an earlier version's choice)",
  },
  floorFiveRoundTrips: {
    path: '/floor-5rt/charges',
    keys: 'new',
    what: 'the earlier protocol hand-written on pg: claim, BEGIN, INSERT, completion, COMMIT, one round trip each',
  },
  floorPrepared: {
    path: '/floor-prepared/charges',
    keys: 'new',
    what: 'the 5-round-trip floor with claim and completion as named prepared statements (what re-planning costs)',
  },
  replay: { path: '/idem/charges', keys: 'replay', what: '@Idempotent(), completed keys replayed from the database' },
  replayFromMemory: {
    path: '/idem-memory/charges',
    keys: 'memory',
    what: '@Idempotent({ replayFromMemory: true }), keys this instance completed replayed from memory',
  },
  floorReplay: {
    path: '/floor/charges',
    keys: 'floor',
    what: "completed keys replayed by the hand-written floor: the claim alone, one round trip (a replay's floor)",
  },
  floorReplayFromMemory: {
    path: '/floor-memory/charges',
    keys: 'floorMemory',
    what: "keys replayed from memory by a hand-written interceptor around the nodb handler (a replay from memory's floor)",
  },
  nodb: { path: '/nodb/charges', keys: 'new', what: 'no database work at all' },
  requestTransaction: {
    path: '/idem-rt/charges',
    keys: 'new',
    what: "@Idempotent({ claimMode: 'request-transaction' }), a new key per request",
  },
  floorRequestTransaction: {
    path: '/floor-rt/charges',
    keys: 'new',
    what: "claim mode 'request-transaction''s protocol hand-written on pg (3 round trips, the key's row written once)",
  },
  realisticBare: {
    path: '/bare/realistic',
    keys: 'new',
    what: 'realistic handler (a read, three inserts, a 5 ms call to a local service) in its own TypeORM transaction',
  },
  realisticModule: {
    path: '/idem/realistic',
    keys: 'new',
    what: 'the realistic handler under @Idempotent(), a new key per request',
  },
  bigBodyBare: {
    path: '/bare/charges',
    keys: 'new',
    body: 'big',
    what: 'the bare handler with a ~1 MiB JSON body, echoed in its response',
  },
  bigBodyModule: {
    path: '/idem/charges',
    keys: 'new',
    body: 'big',
    what: '@Idempotent() with the ~1 MiB body: fingerprinted, its ~1 MiB response captured and stored',
  },
  bareAtPeer: {
    path: '/bare/charges',
    keys: 'new',
    connections: 'peer',
    what: "the bare handler at the peer benchmark's connection count",
  },
  moduleAtPeer: {
    path: '/idem/charges',
    keys: 'new',
    connections: 'peer',
    what: "@Idempotent(), a new key per request, at the peer benchmark's connection count",
  },
  floorAtPeer: {
    path: '/floor/charges',
    keys: 'new',
    connections: 'peer',
    what: "the 3-round-trip floor at the peer benchmark's connection count",
  },
  prismaBare: {
    path: '/prisma-bare/charges',
    keys: 'new',
    what: "the charge created through the app's Prisma client (@prisma/adapter-pg on idempotentPool), no module",
  },
  prismaModule: {
    path: '/prisma-idem/charges',
    keys: 'new',
    what: 'the same Prisma handler under @Idempotent(), a new key per request',
  },
  drizzleBare: {
    path: '/drizzle-bare/charges',
    keys: 'new',
    what: "the charge inserted through the app's Drizzle database (DrizzleTransactionHost#db), no module",
  },
  drizzleModule: {
    path: '/drizzle-idem/charges',
    keys: 'new',
    what: 'the same Drizzle handler under @Idempotent(), a new key per request',
  },
};

export interface VariantResult {
  what: string;
  /** Concurrent HTTP connections of its load. */
  connections: number;
  /** Median of the rounds' throughputs. */
  rps: number;
  roundsRps: number[];
  /** Over the responses of all rounds. */
  latency: LatencySummary;
  requests: number;
  statuses: Record<string, number>;
  unexpected: Record<string, number>;
  errors: number;
  /** CPU per request in microseconds: the app process, its PostgreSQL backends (null when not local), the load generator. */
  cpuMicrosPerRequest: { app: number; postgres: number | null; loader: number };
  /**
   * WAL per request, where measured (scenario 13): bytes written, and flushes to disk
   * (null where the server does not count them). Counted over the whole server, so
   * another database's writes meanwhile count too.
   */
  walPerRequest?: { bytes: number; flushes: number | null };
  /**
   * The key table's updates over the measured load, where counted (the variants
   * that write new keys), and the share that were HOT (null without updates, as
   * in request-transaction mode, which inserts the completed row once). As the
   * statistics had them when the load ended: a busy backend reports at most once
   * a second, an idle one within ten, so the last second's updates may be missing
   * from both counts (the share is the measure).
   */
  keyTableUpdates?: { updates: number; hot: number; hotShare: number | null };
}

export interface StormResult {
  delayMs: number;
  keys: number;
  duplicatesPerKey: number;
  requests: number;
  rps: number;
  latency: LatencySummary;
  statuses: Record<string, number>;
  replayed: number;
  /** Responses that ran the handler (201 and not replayed): must be one per key. */
  executed: number;
  /** Charge rows written: must be one per key. */
  effects: number;
  errors: number;
  timeouts: number;
  pool: PoolPeak;
  ok: boolean;
  /** The same storm (connections, requests, delay) on the route with no database work: the queue the machine itself makes. */
  noDatabase: { rps: number; latency: LatencySummary; statuses: Record<string, number>; errors: number };
}

export interface PathTiming {
  roundTrips: number;
  statements: string[];
  status: number;
  rps?: number;
  latency?: LatencySummary;
}

/** Scenario 10: replays sent at a modest fixed rate while slow handlers hold every business connection. */
export interface SaturationResult {
  /** The module's `reservedConnections` in this app process. */
  reservedConnections: number;
  poolMax: number;
  slow: { connections: number; delayMs: number; rps: number; statuses: Record<string, number> };
  replayRate: number;
  replay: LoadResult;
  /** Peak of the business pool while the replays ran: all in use, some waiting, is what "saturated" means. */
  pool: PoolPeak;
  /** Every replay answered 201 replayed, none failed. */
  ok: boolean;
}

export interface AdapterResults {
  adapter: AdapterName;
  poolMax: number;
  /** Bytes of scenario 11's large request body. */
  bigBodyBytes: number;
  variants: Record<MainVariantName, VariantResult>;
  paths: Record<'newKey' | 'replay' | 'conflict' | 'mismatch' | 'bare' | 'floor' | 'requestTransaction', PathTiming>;
  storms: StormResult[];
  /** With the module's default reserved pool, then with `reservedConnections: 0` (in a second app process). */
  saturation: { reserved: SaturationResult; shared: SaturationResult };
}

/** The module's default `reservedConnections`, which the first app process runs with. */
const DEFAULT_RESERVED = 2;

/** Scenarios 1-4 and 7-12 against one adapter, in app processes of its own. */
export async function runHttpScenarios(
  adapter: AdapterName,
  config: BenchConfig,
  databaseUrl: string,
  db: pg.Client,
  log: (line: string) => void,
): Promise<AdapterResults> {
  await truncateAll(db);
  const service = await SlowService.start(config.serviceDelayMs);
  const appOptions = { adapter, databaseUrl, schema: config.schema, poolSize: config.poolSize };
  const app = await AppProcess.start({ ...appOptions, env: { BENCH_SERVICE_URL: service.url } });
  let replayKeys: string[];
  let measured: Omit<AdapterResults, 'saturation'>;
  let reserved: SaturationResult;
  try {
    const cpu = new BackendCpu(db, APP_APPLICATION_NAME);
    replayKeys = await createCompletedKeys(app, config, `replay-${adapter}-${randomUUID()}`);
    const memoryKeys = await createCompletedKeys(
      app,
      config,
      `memory-${adapter}-${randomUUID()}`,
      VARIANTS.replayFromMemory.path,
    );
    const floorKeys = await createCompletedKeys(app, config, `floor-${adapter}-${randomUUID()}`, VARIANTS.floorReplay.path);
    const floorMemoryKeys = await createCompletedKeys(
      app,
      config,
      `floor-memory-${adapter}-${randomUUID()}`,
      VARIANTS.floorReplayFromMemory.path,
    );
    await vacuumAnalyze(db);
    const bodies = { big: bigBody(config.bigBodyBytes) };

    const order = (Object.keys(VARIANTS) as VariantName[]).filter(
      (name): name is MainVariantName => name !== 'floorAsyncClaim' && !(LAYER_VARIANTS as readonly string[]).includes(name),
    );
    // A new key's completion updates its row: counted where the module writes new keys, to see it done as a HOT update.
    const keyUpdates = { counter: new KeyTableUpdateCounter(db), variants: ['module', 'requestTransaction'] as const };
    const variants = await measureVariants(
      app,
      order,
      config,
      { cpu, keyUpdates, bigBody: bodies.big, replayKeys, memoryKeys, floorKeys, floorMemoryKeys },
      log,
    );

    const conflict = await conflictLoad(app, config, adapter, log);
    const mismatch = await mismatchLoad(app, config, adapter, log);
    const roundTrips = await countRoundTrips(app, adapter);
    const paths: AdapterResults['paths'] = {
      newKey: { ...roundTrips.newKey, rps: variants.module.rps, latency: variants.module.latency },
      replay: { ...roundTrips.replay, rps: variants.replay.rps, latency: variants.replay.latency },
      conflict: { ...roundTrips.conflict, rps: conflict.rps, latency: conflict.latency },
      mismatch: { ...roundTrips.mismatch, rps: mismatch.rps, latency: mismatch.latency },
      bare: { ...roundTrips.bare, rps: variants.bare.rps, latency: variants.bare.latency },
      floor: { ...roundTrips.floor, rps: variants.floor.rps, latency: variants.floor.latency },
      requestTransaction: {
        ...roundTrips.requestTransaction,
        rps: variants.requestTransaction.rps,
        latency: variants.requestTransaction.latency,
      },
    };

    const storms: StormResult[] = [];
    for (const delayMs of config.stormDelaysMs) storms.push(await storm(app, config, db, adapter, delayMs, log));
    measured = { adapter, poolMax: app.poolMax, bigBodyBytes: Buffer.byteLength(bodies.big), variants, paths, storms };
    reserved = await replayUnderSaturation(app, config, replayKeys, DEFAULT_RESERVED, log);
  } finally {
    await app.close();
  }
  // The same replays with claims sharing the business pool: what the reserved pool buys.
  const sharedApp = await AppProcess.start({ ...appOptions, env: { BENCH_RESERVED_CONNECTIONS: '0' } });
  try {
    const shared = await replayUnderSaturation(sharedApp, config, replayKeys, 0, log);
    return { ...measured, saturation: { reserved, shared } };
  } finally {
    await sharedApp.close();
    await service.close();
  }
}

/**
 * Steady load on each variant, `config.rounds` times, interleaved (the order
 * rotated each round, so no variant always runs first or right after a heavy
 * one), with the server CPU each measurement cost and, when a WAL counter is
 * given, the WAL it wrote and flushed.
 */
export async function measureVariants<N extends VariantName>(
  app: AppProcess,
  order: readonly N[],
  config: BenchConfig,
  options: {
    cpu: BackendCpu;
    wal?: WalCounter;
    /** Counts the key table's updates over the loads of the variants it names. */
    keyUpdates?: { counter: KeyTableUpdateCounter; variants: readonly VariantName[] };
    bigBody?: string;
    replayKeys?: string[];
    memoryKeys?: string[];
    floorKeys?: string[];
    floorMemoryKeys?: string[];
  },
  log: (line: string) => void,
): Promise<Record<N, VariantResult>> {
  const connectionsOf = (name: VariantName) =>
    VARIANTS[name].body === 'big'
      ? config.bigBodyConnections
      : VARIANTS[name].connections === 'peer'
        ? config.peerConnections
        : config.connections;
  const runs = new Map<N, Measured[]>();
  let replayIndex = 0;
  for (let round = 0; round < config.rounds; round++) {
    const rotated = [...order.slice(round % order.length), ...order.slice(0, round % order.length)];
    for (const name of rotated) {
      const variant = VARIANTS[name];
      const replayKeys = {
        new: undefined,
        replay: options.replayKeys,
        memory: options.memoryKeys,
        floor: options.floorKeys,
        floorMemory: options.floorMemoryKeys,
      }[variant.keys];
      if (variant.keys !== 'new' && !replayKeys?.length) throw new Error(`Variant ${name} replays keys, and none were made.`);
      const key = variant.keys === 'new' ? () => randomUUID() : () => replayKeys![replayIndex++ % replayKeys!.length];
      const body = variant.body === 'big' ? options.bigBody : BODY;
      if (body === undefined) throw new Error(`Variant ${name} sends the big body, and none was given.`);
      const load = { url: app.url, path: variant.path, body, connections: connectionsOf(name), key };
      await runLoad({ ...load, seconds: round === 0 ? config.warmupSeconds : config.rewarmSeconds });
      const updateCounter = options.keyUpdates?.variants.includes(name) ? options.keyUpdates.counter : undefined;
      const updatesBefore = await updateCounter?.snapshot();
      const walBefore = await options.wal?.snapshot();
      const before = await cpuNow(app, options.cpu);
      const run = await runLoad({ ...load, seconds: config.measureSeconds });
      const spent = await cpuSince(app, options.cpu, before);
      const wal = walBefore && (await options.wal!.since(walBefore));
      const updates = updatesBefore && (await updateCounter!.since(updatesBefore));
      runs.set(name, [...(runs.get(name) ?? []), { run, cpu: spent, wal, updates }]);
      log(`  ${app.adapter} round ${round + 1}/${config.rounds} ${name.padEnd(20)} ${describe(run)}`);
    }
  }
  return Object.fromEntries(order.map((name) => [name, mergeRounds(name, runs.get(name)!, connectionsOf(name))])) as Record<
    N,
    VariantResult
  >;
}

/**
 * A ~`bytes` JSON charge whose `metadata` holds an order's line items:
 * thousands of small objects whose keys are not in sorted order, so the
 * canonical fingerprint has its real work to do.
 */
export function bigBody(bytes: number): string {
  const lines: object[] = [];
  const charge = { ...CHARGE, metadata: { order: 'ord_bench', lines } };
  let size = Buffer.byteLength(JSON.stringify(charge));
  for (let i = 0; ; i++) {
    const line = {
      sku: `sku-${String(i).padStart(6, '0')}`,
      description: `Line item ${i} of the benchmark order`,
      quantity: 1 + (i % 5),
      unitAmount: 100 + ((i * 37) % 10_000),
      tags: ['bench', i % 2 ? 'odd' : 'even'],
    };
    const added = Buffer.byteLength(JSON.stringify(line)) + (lines.length ? 1 : 0);
    if (size + added > bytes) break;
    lines.push(line);
    size += added;
  }
  return JSON.stringify(charge);
}

/**
 * Scenario 10: `saturationConnections` connections send new keys to the
 * module route with a handler that holds its transaction
 * `saturationDelayMs`, more than the business pool has connections; after
 * a warm-up, completed keys are replayed at a fixed modest rate (open loop)
 * and their latency measured.
 */
async function replayUnderSaturation(
  app: AppProcess,
  config: BenchConfig,
  replayKeys: string[],
  reservedConnections: number,
  log: (line: string) => void,
): Promise<SaturationResult> {
  await app.quiet();
  const slowBody = JSON.stringify({ ...CHARGE, delayMs: config.saturationDelayMs });
  const slowLoad = runLoad({
    url: app.url,
    path: VARIANTS.module.path,
    body: slowBody,
    connections: config.saturationConnections,
    // Outlasts the replays, so the pool stays saturated until the last of them.
    seconds: config.warmupSeconds + config.saturationSeconds + 2,
    key: () => randomUUID(),
  });
  await sleep(config.warmupSeconds * 1000);
  await app.poolWatchStart();
  let index = 0;
  const replay = await runAtRate({
    url: app.url,
    path: VARIANTS.replay.path,
    body: BODY,
    rate: config.saturationReplayRate,
    seconds: config.saturationSeconds,
    key: () => replayKeys[index++ % replayKeys.length],
  });
  const pool = await app.poolWatchStop();
  const slow = await slowLoad;
  // The load generator hangs up on requests still running; let them finish before the app is closed or measured again.
  await app.quiet();
  const { samples: _samples, ...replayResult } = replay;
  const ok =
    replay.errors === 0 &&
    replay.timeouts === 0 &&
    replay.replayed === replay.requests &&
    Object.keys(unexpectedStatuses(replay, [201])).length === 0;
  log(
    `  ${app.adapter} replays under saturation (reservedConnections ${reservedConnections}): ${describe(replay)}; ` +
      `slow handlers ${describe(slow).trim()}; business pool peak ${pool.inUse}/${pool.max} in use, ${pool.waiting} waiting`,
  );
  return {
    reservedConnections,
    poolMax: app.poolMax,
    slow: {
      connections: config.saturationConnections,
      delayMs: config.saturationDelayMs,
      rps: slow.rps,
      statuses: slow.statuses,
    },
    replayRate: config.saturationReplayRate,
    replay: replayResult,
    pool,
    ok,
  };
}

/** Completed keys for the replay variant, made through the module itself. */
export async function createCompletedKeys(
  app: AppProcess,
  config: BenchConfig,
  prefix: string,
  path = VARIANTS.replay.path,
): Promise<string[]> {
  const keys: string[] = [];
  const run = await runLoad({
    url: app.url,
    path,
    body: BODY,
    connections: config.connections,
    amount: config.replayKeys,
    key: () => {
      const key = `${prefix}-${keys.length}`;
      keys.push(key);
      return key;
    },
  });
  if ((run.statuses['201'] ?? 0) !== config.replayKeys) {
    throw new Error(`Creating replay keys: expected ${config.replayKeys} x 201, got ${JSON.stringify(run.statuses)}.`);
  }
  return keys;
}

interface CpuSnapshot {
  app: number;
  postgres: Map<number, number> | null;
  loader: NodeJS.CpuUsage;
}
interface Measured {
  run: LoadRun;
  cpu: CpuSpent;
  wal?: WalSpent;
  updates?: KeyTableUpdates;
}
interface CpuSpent {
  app: number;
  postgres: number | null;
  loader: number;
}

export async function cpuNow(app: AppProcess, cpu: BackendCpu): Promise<CpuSnapshot> {
  return { app: await app.cpuMicros(), postgres: await cpu.snapshot(), loader: process.cpuUsage() };
}

export async function cpuSince(app: AppProcess, cpu: BackendCpu, before: CpuSnapshot): Promise<CpuSpent> {
  const loader = process.cpuUsage(before.loader);
  const app_ = (await app.cpuMicros()) - before.app;
  const postgresMs = BackendCpu.since(before.postgres, await cpu.snapshot());
  return { app: app_, postgres: postgresMs === null ? null : postgresMs * 1000, loader: loader.user + loader.system };
}

function mergeRounds(name: VariantName, rounds: Measured[], connections: number): VariantResult {
  const requests = rounds.reduce((n, r) => n + r.run.requests, 0);
  const statuses: Record<string, number> = {};
  for (const { run } of rounds) for (const [s, n] of Object.entries(run.statuses)) statuses[s] = (statuses[s] ?? 0) + n;
  const merged: LoadResult = { ...rounds[0].run, statuses };
  const unexpected = unexpectedStatuses(merged, [201]);
  const replayed = rounds.reduce((n, r) => n + r.run.replayed, 0);
  // A replay run (from the database or from memory: its keys are completed ones) must replay every time, and nothing
  // else may.
  const replays = VARIANTS[name].keys !== 'new';
  if (replays && replayed !== requests) unexpected['201-not-replayed'] = requests - replayed;
  if (!replays && replayed > 0) unexpected['201-replayed'] = replayed;
  const postgres = rounds.every((r) => r.cpu.postgres !== null)
    ? round(rounds.reduce((n, r) => n + r.cpu.postgres!, 0) / requests, 1)
    : null;
  return {
    what: VARIANTS[name].what,
    connections,
    rps: round(median(rounds.map((r) => r.run.rps)), 1),
    roundsRps: rounds.map((r) => r.run.rps),
    latency: summarize(rounds.flatMap((r) => r.run.samples)),
    requests,
    statuses,
    unexpected,
    errors: rounds.reduce((n, r) => n + r.run.errors + r.run.timeouts, 0),
    cpuMicrosPerRequest: {
      app: round(rounds.reduce((n, r) => n + r.cpu.app, 0) / requests, 1),
      postgres,
      loader: round(rounds.reduce((n, r) => n + r.cpu.loader, 0) / requests, 1),
    },
    ...(rounds.every((r) => r.wal)
      ? {
          walPerRequest: {
            bytes: round(rounds.reduce((n, r) => n + r.wal!.bytes, 0) / requests, 0),
            flushes: rounds.every((r) => r.wal!.flushes !== null)
              ? round(rounds.reduce((n, r) => n + r.wal!.flushes!, 0) / requests, 2)
              : null,
          },
        }
      : {}),
    ...(rounds.every((r) => r.updates) ? { keyTableUpdates: keyTableUpdatesOf(rounds) } : {}),
  };
}

function keyTableUpdatesOf(rounds: Measured[]): VariantResult['keyTableUpdates'] {
  const updates = rounds.reduce((n, r) => n + r.updates!.updates, 0);
  const hot = rounds.reduce((n, r) => n + r.updates!.hot, 0);
  return { updates, hot, hotShare: updates === 0 ? null : round(hot / updates, 3) };
}

/** 409s: duplicates of a key whose first request is still running (a slow handler holds it in flight). */
async function conflictLoad(
  app: AppProcess,
  config: BenchConfig,
  adapter: string,
  log: (line: string) => void,
): Promise<LoadResult> {
  const key = `held-${adapter}-${randomUUID()}`;
  const body = JSON.stringify({ ...CHARGE, delayMs: (config.warmupSeconds + config.measureSeconds + 2) * 1000 });
  const holder = post(app.url, VARIANTS.module.path, body, key);
  await sleep(300);
  const load = { url: app.url, path: VARIANTS.module.path, body, connections: config.connections, key: () => key };
  await runLoad({ ...load, seconds: config.warmupSeconds });
  const run = await runLoad({ ...load, seconds: config.measureSeconds });
  const held = await holder;
  if (held.status !== 201) throw new Error(`The request holding the key answered ${held.status}, not 201.`);
  log(`  ${adapter} ${'409 path'.padEnd(28)} ${describe(run)}`);
  return run;
}

/** 422s: a completed key sent again with a different body. */
async function mismatchLoad(
  app: AppProcess,
  config: BenchConfig,
  adapter: string,
  log: (line: string) => void,
): Promise<LoadResult> {
  const key = `mismatch-${adapter}-${randomUUID()}`;
  const first = await post(app.url, VARIANTS.module.path, BODY, key);
  if (first.status !== 201) throw new Error(`Completing the mismatch key answered ${first.status}.`);
  const load = {
    url: app.url,
    path: VARIANTS.module.path,
    body: JSON.stringify({ ...CHARGE, amount: CHARGE.amount + 1 }),
    connections: config.connections,
    key: () => key,
  };
  await runLoad({ ...load, seconds: config.warmupSeconds });
  const run = await runLoad({ ...load, seconds: config.measureSeconds });
  log(`  ${adapter} ${'422 path'.padEnd(28)} ${describe(run)}`);
  return run;
}

/** Scenario 7: the statements one request of each path sends, counted by a TypeORM logger in the app. */
async function countRoundTrips(app: AppProcess, adapter: string): Promise<Record<keyof AdapterResults['paths'], PathTiming>> {
  const count = async (send: () => Promise<{ status: number }>): Promise<PathTiming> => {
    // Requests still running from an earlier load would be counted too.
    await app.quiet();
    await app.countStart();
    const { status } = await send();
    const statements = await app.countStop();
    return { roundTrips: statements.length, statements, status };
  };
  // Some new keys first, so the pools are warm and the routing sees the steady state (a claim goes to the claim pool
  // only while the main pool is saturated; at READ COMMITTED a new key costs three round trips either way).
  await runLoad({ url: app.url, path: VARIANTS.module.path, body: BODY, connections: 4, amount: 200, key: () => randomUUID() });
  const key = `rt-${adapter}-${randomUUID()}`;
  const newKey = await count(() => post(app.url, VARIANTS.module.path, BODY, key));
  const replay = await count(() => post(app.url, VARIANTS.module.path, BODY, key));
  const mismatch = await count(() => post(app.url, VARIANTS.module.path, JSON.stringify({ ...CHARGE, amount: 1 }), key));

  const held = `rt-held-${adapter}-${randomUUID()}`;
  const slowBody = JSON.stringify({ ...CHARGE, delayMs: 1_500 });
  const holder = post(app.url, VARIANTS.module.path, slowBody, held);
  await sleep(300);
  const conflict = await count(() => post(app.url, VARIANTS.module.path, slowBody, held));
  await holder;

  const bare = await count(() => post(app.url, VARIANTS.bare.path, BODY, randomUUID()));
  const floor = await count(() => post(app.url, VARIANTS.floor.path, BODY, randomUUID()));
  const requestTransaction = await count(() => post(app.url, VARIANTS.requestTransaction.path, BODY, randomUUID()));
  return { newKey, replay, conflict, mismatch, bare, floor, requestTransaction };
}

/**
 * Scenario 4: `stormConnections` connections all sending the same key and
 * body, key after key. The n-th request overall uses key floor(n / connections),
 * so each key gets exactly that many duplicates, nearly all at once.
 * A route that writes nothing (the hand-written floors) counts no effects, so its `ok` is false: read its latency only.
 */
export async function storm(
  app: AppProcess,
  config: BenchConfig,
  db: pg.Client,
  adapter: string,
  delayMs: number,
  log: (line: string) => void,
  /** The route stormed: the module's by default; `bench:storm` also storms others (see storm.ts). */
  variant: VariantName = 'module',
): Promise<StormResult> {
  const duplicates = config.stormConnections;
  const stormLoad = (customer: string, keys: number, path = VARIANTS[variant].path) => {
    let n = 0;
    return runLoad({
      url: app.url,
      path,
      body: JSON.stringify({ ...CHARGE, customer, delayMs: delayMs || undefined }),
      connections: duplicates,
      amount: duplicates * keys,
      timeoutSeconds: 60,
      key: () => `${customer}-${Math.floor(n++ / duplicates)}`,
    });
  };
  // The same storm on the route with no database work (which waits the same delay) first: 1000
  // connections at once on 2 cores queue in the kernel and the event loop whatever the route does,
  // so the module's part of the tail is its p99 against this one's.
  await stormLoad(`warm-nodb-storm-${adapter}-${randomUUID()}`, 1, VARIANTS.nodb.path);
  const noDatabaseRun = await stormLoad(`nodb-storm-${adapter}-${delayMs}-${randomUUID()}`, config.stormKeys, VARIANTS.nodb.path);
  await stormLoad(`warm-storm-${adapter}-${randomUUID()}`, 1);
  const customer = `storm-${adapter}-${delayMs}-${randomUUID()}`;
  await app.poolWatchStart();
  const run = await stormLoad(customer, config.stormKeys);
  const pool = await app.poolWatchStop();
  const effects = Number(
    (await db.query(`SELECT count(*) AS n FROM ${CHARGES_TABLE} WHERE customer = $1`, [customer])).rows[0].n,
  );
  const executed = (run.statuses['201'] ?? 0) - run.replayed;
  const ok =
    run.errors === 0 &&
    run.timeouts === 0 &&
    run.requests === duplicates * config.stormKeys &&
    Object.keys(unexpectedStatuses(run, [201, 409])).length === 0 &&
    effects === config.stormKeys &&
    executed === config.stormKeys &&
    pool.total <= pool.max;
  log(
    `  ${adapter} storm delay ${delayMs} ms: ${describe(run)}; executed ${executed}, effects ${effects}, ` +
      `pool peak ${pool.inUse}/${pool.max} in use, ${pool.waiting} waiting; no-database route ${describe(noDatabaseRun).trim()}`,
  );
  const { samples: _samples, ...result } = run;
  return {
    delayMs,
    keys: config.stormKeys,
    duplicatesPerKey: duplicates,
    requests: result.requests,
    rps: result.rps,
    latency: result.latency,
    statuses: result.statuses,
    replayed: result.replayed,
    executed,
    effects,
    errors: result.errors,
    timeouts: result.timeouts,
    pool,
    ok,
    noDatabase: {
      rps: noDatabaseRun.rps,
      latency: noDatabaseRun.latency,
      statuses: noDatabaseRun.statuses,
      errors: noDatabaseRun.errors + noDatabaseRun.timeouts,
    },
  };
}

async function post(url: string, path: string, body: string, key: string): Promise<{ status: number }> {
  const response = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body,
  });
  await response.arrayBuffer();
  return { status: response.status };
}

function describe(run: LoadResult): string {
  const statuses = Object.entries(run.statuses)
    .map(([s, n]) => `${s}x${n}`)
    .join(' ');
  const errors = run.errors + run.timeouts ? ` errors ${run.errors + run.timeouts}` : '';
  return `${run.rps.toFixed(0).padStart(6)} req/s  p50 ${run.latency.p50.toFixed(2)} ms  p99 ${run.latency.p99.toFixed(2)} ms  [${statuses}]${errors}`;
}
