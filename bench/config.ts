import { DEFAULT_SWEEP_BATCH_SIZE } from '../src/idempotency.constants.js';
export type AdapterName = 'express' | 'fastify';
export type ScenarioGroup = 'http' | 'size' | 'sweep' | 'durable' | 'retention' | 'layers';

/** Everything a run can be told through the environment; `BENCH_QUICK=1` shrinks it for development. */
export interface BenchConfig {
  mode: 'full' | 'quick';
  adapters: AdapterName[];
  /**
   * Which groups run: `http` (scenarios 1-4, 7-12), `size` (5), `sweep` (6), `durable` (13, when
   * `durableDatabaseUrl` is set), `retention` (14), `layers` (15: Prisma and Drizzle).
   */
  groups: ScenarioGroup[];
  schema: string;
  /**
   * Scenario 13: a PostgreSQL with durable commits (`fsync` on), where the
   * claim's own commit shows; the bench drops and recreates `schema` in it.
   * Unset: scenario 13 does not run.
   */
  durableDatabaseUrl?: string;
  /** Connections of the app's pg pool (TypeORM `extra.max`); pg's own default is 10. */
  poolSize: number;
  /** Concurrent HTTP connections of the steady-load measurements. */
  connections: number;
  /**
   * Scenario 12: new keys (bare, module, floor) at the connection count of the
   * peer library's published benchmark, so its figures and ours can be set side by side.
   */
  peerConnections: number;
  /** Each variant is measured this many times, interleaved with the others, so drift hits all alike. */
  rounds: number;
  /** Load before each variant's first measured round; later rounds warm up for `rewarmSeconds`. */
  warmupSeconds: number;
  rewarmSeconds: number;
  measureSeconds: number;
  /** Completed keys that the replay measurement cycles through. */
  replayKeys: number;
  stormConnections: number;
  /** Keys per storm: each gets `stormConnections` duplicates. */
  stormKeys: number;
  /** Handler delays of the storms: 0 is the bare handler, a delay keeps keys in flight longer (more 409s). */
  stormDelaysMs: number[];
  /** Scenario 9: how long the realistic handler's call to the other local HTTP service takes. */
  serviceDelayMs: number;
  /** Scenario 10: connections keeping the business pool busy with slow handlers, and how long each holds its transaction. */
  saturationConnections: number;
  saturationDelayMs: number;
  /** Scenario 10: replays per second sent meanwhile (open loop), and for how long. */
  saturationReplayRate: number;
  saturationSeconds: number;
  /** Scenario 11: size of the large JSON request body (its response echoes it), and the connections sending it. */
  bigBodyBytes: number;
  bigBodyConnections: number;
  smallRows: number;
  bigRows: number;
  expiredRows: number;
  /** Claims per second (half new keys, half replays) of the latency probes in scenarios 5 and 6. */
  claimRate: number;
  claimSeconds: number;
  claimWarmupSeconds: number;
  sweepBatchSize: number;
  /** Scenario 14: keys in each table, half of them a day past its TTL (what retention retires), half live. */
  retentionRows: number;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): BenchConfig {
  const quick = env.BENCH_QUICK === '1' || env.BENCH_QUICK === 'true';
  const pick = <T>(full: T, fast: T): T => (quick ? fast : full);
  return {
    mode: quick ? 'quick' : 'full',
    adapters: list(env.BENCH_ADAPTERS, ['express', 'fastify'] as const, 'BENCH_ADAPTERS'),
    groups: list(env.BENCH_ONLY, ['http', 'layers', 'size', 'sweep', 'durable', 'retention'] as const, 'BENCH_ONLY'),
    schema: env.BENCH_SCHEMA ?? 'bench',
    durableDatabaseUrl: env.BENCH_DURABLE_DATABASE_URL || undefined,
    poolSize: int(env, 'BENCH_POOL_SIZE', 10),
    connections: int(env, 'BENCH_CONNECTIONS', 16),
    peerConnections: int(env, 'BENCH_PEER_CONNECTIONS', 50),
    rounds: int(env, 'BENCH_ROUNDS', pick(3, 1)),
    warmupSeconds: int(env, 'BENCH_WARMUP_S', pick(2, 1)),
    // The variant's route and code paths are warm by then; a short load settles the pool after the previous variant.
    rewarmSeconds: int(env, 'BENCH_REWARM_S', 1),
    // 4 s x 3 rounds per variant keeps a full run of all scenarios within about 15 minutes on 2 cores.
    measureSeconds: int(env, 'BENCH_MEASURE_S', pick(4, 2)),
    replayKeys: pick(1_000, 200),
    stormConnections: int(env, 'BENCH_STORM_CONNECTIONS', 1_000),
    stormKeys: pick(10, 3),
    stormDelaysMs: [0, 25],
    serviceDelayMs: int(env, 'BENCH_SERVICE_DELAY_MS', 5),
    saturationConnections: int(env, 'BENCH_SATURATION_CONNECTIONS', 20),
    saturationDelayMs: int(env, 'BENCH_SATURATION_DELAY_MS', 200),
    saturationReplayRate: int(env, 'BENCH_SATURATION_REPLAY_RATE', 50),
    saturationSeconds: int(env, 'BENCH_SATURATION_S', pick(6, 4)),
    bigBodyBytes: int(env, 'BENCH_BIG_BODY_BYTES', 1024 * 1024 - 1024),
    // Fewer than the small requests': 16 at once would queue for seconds, measuring the queue rather than the cost.
    bigBodyConnections: int(env, 'BENCH_BIG_BODY_CONNECTIONS', 4),
    smallRows: int(env, 'BENCH_SMALL_ROWS', 10_000),
    bigRows: int(env, 'BENCH_BIG_ROWS', pick(10_000_000, 200_000)),
    expiredRows: int(env, 'BENCH_EXPIRED_ROWS', pick(1_000_000, 300_000)),
    claimRate: int(env, 'BENCH_CLAIM_RATE', 400),
    claimSeconds: int(env, 'BENCH_CLAIM_S', pick(15, 4)),
    claimWarmupSeconds: pick(3, 1),
    sweepBatchSize: int(env, 'BENCH_SWEEP_BATCH', DEFAULT_SWEEP_BATCH_SIZE),
    retentionRows: int(env, 'BENCH_RETENTION_ROWS', pick(10_000_000, 200_000)),
  };
}

function int(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw.replace(/_/g, ''));
  if (!Number.isInteger(value) || value <= 0) throw new Error(`${name} must be a positive integer (got "${raw}").`);
  return value;
}

function list<T extends string>(raw: string | undefined, allowed: readonly T[], name: string): T[] {
  if (!raw) return [...allowed];
  const values = raw.split(',').map((v) => v.trim());
  for (const value of values) {
    if (!allowed.includes(value as T)) throw new Error(`${name}: "${value}" is not one of ${allowed.join(', ')}.`);
  }
  return values as T[];
}
