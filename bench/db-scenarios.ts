import { performance } from 'node:perf_hooks';
import { DEFAULT_SWEEP_DUTY_CYCLE } from '../src/idempotency.constants.js';
import type pg from 'pg';
import { openStore, probeClaims, type ClaimProbe } from './claims.js';
import type { BenchConfig } from './config.js';
import {
  ActivitySampler,
  connect,
  countKeys,
  fillKeys,
  KEY_TABLE,
  sampleCompletedKeys,
  truncateAll,
  vacuumAnalyze,
  type ExistingKey,
  type PhaseActivity,
} from './database.js';
import { round } from './stats.js';

/** A claim probe with what PostgreSQL was waiting on meanwhile. */
export type ObservedProbe = ClaimProbe & { activity: PhaseActivity };

export interface TableSizeResult {
  small: { rows: number; probe: ObservedProbe };
  big: { rows: number; fillSeconds: number; vacuumSeconds: number; tableBytes: number; indexBytes: number; probe: ObservedProbe };
}

export interface SweepScenarioResult {
  expiredRows: number;
  liveRows: number;
  fillSeconds: number;
  sweep: { ran: boolean; deleted: number; batches: number; durationMs: number; rowsPerSecond: number; batchSize: number };
  idle: ObservedProbe;
  duringSweep: ObservedProbe;
}

/** Runs a probe with the activity sampler on. */
async function observed(sampler: ActivitySampler, probe: () => Promise<ClaimProbe>): Promise<ObservedProbe> {
  await sampler.start();
  const result = await probe();
  return { ...result, activity: await sampler.stop() };
}

/** Scenario 5: claim latency with a small and a big key table, probed at the same fixed rate. */
export async function runTableSize(
  config: BenchConfig,
  url: string,
  db: pg.Client,
  log: (line: string) => void,
): Promise<TableSizeResult> {
  await truncateAll(db);
  await fillKeys(db, config.smallRows, 'live');
  await vacuumAnalyze(db);
  const { store, close } = await openStore(url, config.schema, 8);
  const sampler = new ActivitySampler(await connect(url, config.schema));
  try {
    const probe = async (label: string) => {
      const existing = await sampleCompletedKeys(db, replaySampleSize(config));
      await probeClaims(store, existing, { rate: config.claimRate, seconds: config.claimWarmupSeconds });
      const result = await observed(sampler, () =>
        probeClaims(store, existing, { rate: config.claimRate, seconds: config.claimSeconds }),
      );
      log(`  ${label}: ${describeProbe(result)}`);
      return result;
    };
    const smallRows = await countKeys(db);
    const small = await probe(`${smallRows.toLocaleString('en')} rows`);

    const toAdd = Math.max(0, config.bigRows - (await countKeys(db)));
    log(`  filling ${toAdd.toLocaleString('en')} rows with one INSERT ... SELECT generate_series ...`);
    const fillStarted = performance.now();
    await fillKeys(db, toAdd, 'live');
    const fillSeconds = round((performance.now() - fillStarted) / 1000, 1);
    const vacuumStarted = performance.now();
    await vacuumAnalyze(db);
    const vacuumSeconds = round((performance.now() - vacuumStarted) / 1000, 1);
    const { rows } = await db.query<{ table_bytes: string; index_bytes: string }>(
      `SELECT pg_table_size($1::regclass) AS table_bytes, pg_indexes_size($1::regclass) AS index_bytes`,
      [KEY_TABLE],
    );
    const bigRows = await countKeys(db);
    log(
      `  fill took ${fillSeconds} s (+ VACUUM ANALYZE ${vacuumSeconds} s): ${bigRows.toLocaleString('en')} rows, ` +
        `table ${mb(rows[0].table_bytes)}, indexes ${mb(rows[0].index_bytes)}`,
    );
    const big = await probe(`${bigRows.toLocaleString('en')} rows`);
    return {
      small: { rows: smallRows, probe: small },
      big: {
        rows: bigRows,
        fillSeconds,
        vacuumSeconds,
        tableBytes: Number(rows[0].table_bytes),
        indexBytes: Number(rows[0].index_bytes),
        probe: big,
      },
    };
  } finally {
    await close();
    await sampler.close();
  }
}

/** Scenario 6: the library's sweep over many expired rows, and what claims feel meanwhile. */
export async function runSweep(
  config: BenchConfig,
  url: string,
  db: pg.Client,
  log: (line: string) => void,
): Promise<SweepScenarioResult> {
  await truncateAll(db);
  await fillKeys(db, config.smallRows, 'live');
  await vacuumAnalyze(db);
  // Sampled before the expired rows exist, so the replays hit live keys only.
  const existing: ExistingKey[] = await sampleCompletedKeys(db, replaySampleSize(config));
  const fillStarted = performance.now();
  await fillKeys(db, config.expiredRows, 'expired');
  await vacuumAnalyze(db);
  const fillSeconds = round((performance.now() - fillStarted) / 1000, 1);
  log(`  ${config.expiredRows.toLocaleString('en')} expired rows filled in ${fillSeconds} s`);

  const claimer = await openStore(url, config.schema, 8);
  // The sweeper gets a pool of its own, as a separate instance of the app would.
  const sweeper = await openStore(url, config.schema, 2);
  const sampler = new ActivitySampler(await connect(url, config.schema));
  try {
    await probeClaims(claimer.store, existing, { rate: config.claimRate, seconds: config.claimWarmupSeconds });
    const idle = await observed(sampler, () =>
      probeClaims(claimer.store, existing, { rate: config.claimRate, seconds: config.claimSeconds }),
    );
    log(`  idle:         ${describeProbe(idle)}`);
    let sweeping: ReturnType<typeof sweeper.store.sweep> | undefined;
    const duringSweep = await observed(sampler, () => {
      // The module's default pacing, as the scheduled sweeper runs it (BENCH_SWEEP_DUTY_CYCLE=1: flat out).
      sweeping = sweeper.store.sweep({
        batchSize: config.sweepBatchSize,
        maxDurationMs: 60 * 60 * 1000,
        dutyCycle: Number(process.env.BENCH_SWEEP_DUTY_CYCLE ?? DEFAULT_SWEEP_DUTY_CYCLE),
      });
      return probeClaims(claimer.store, existing, { rate: config.claimRate, until: sweeping });
    });
    const result = await sweeping!;
    log(`  during sweep: ${describeProbe(duringSweep)}`);
    log(
      `  sweep: ${result.deleted.toLocaleString('en')} rows in ${result.batches} batches, ${result.durationMs} ms (${result.restedMs} ms resting)`,
    );
    return {
      expiredRows: config.expiredRows,
      liveRows: config.smallRows,
      fillSeconds,
      sweep: {
        ...result,
        rowsPerSecond: Math.round(result.deleted / (result.durationMs / 1000)),
        batchSize: config.sweepBatchSize,
      },
      idle,
      duringSweep,
    };
  } finally {
    await claimer.close();
    await sweeper.close();
    await sampler.close();
  }
}

/** Enough distinct keys that replays mostly read rows not touched before, as retries of many clients would. */
function replaySampleSize(config: BenchConfig): number {
  return Math.min(20_000, Math.ceil((config.claimRate * (config.claimSeconds + config.claimWarmupSeconds)) / 2));
}

function describeProbe(probe: ObservedProbe): string {
  const f = (n: number) => n.toFixed(2);
  const waits = Object.entries(probe.activity.waits)
    .filter(([key]) => key.startsWith('claim'))
    .slice(0, 2)
    .map(([key, n]) => `${key.replace('claim: ', '')} x${n}`)
    .join(', ');
  return (
    `new key p50 ${f(probe.newKeys.p50)} / p99 ${f(probe.newKeys.p99)} ms, replay p50 ${f(probe.replays.p50)} / p99 ` +
    `${f(probe.replays.p99)} ms (${probe.newKeys.count + probe.replays.count} claims in ${probe.seconds} s` +
    `${probe.unexpected ? `, ${probe.unexpected} unexpected` : ''}${probe.skipped ? `, ${probe.skipped} skipped` : ''})` +
    `; claims waited on: ${waits || 'nothing sampled'}; WAL ${mb(String(probe.activity.walBytes))}`
  );
}

function mb(bytes: string): string {
  const value = Number(bytes) / 1024 / 1024;
  return `${value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString('en')} MB`;
}
