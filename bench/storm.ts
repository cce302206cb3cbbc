/**
 * Scenario 4 alone, round after round: `npm run bench:storm`. The duplicate
 * storm (1000 connections sending one key at once, key after key, beside the
 * same storm on the route with no database work) on each adapter and handler
 * delay, `BENCH_ROUNDS` times, with the medians of its p99 ratio. For
 * comparing a change to the storm's path without the whole bench; the full
 * run (`npm run bench`) reports the same figures once per run.
 *
 * `BENCH_STORM_VARIANTS` (default `module`) storms other routes of the bench
 * too, each against the same no-database route: `replayFromMemory` (the
 * module answering from memory), `floorReplayFromMemory` (a replay from
 * memory written by hand: the storm's floor inside Nest). A route that writes
 * nothing counts no effects, so its `ok` reads false.
 *
 * Env: as `npm run bench` (BENCH_ADAPTERS, BENCH_ROUNDS, BENCH_STORM_CONNECTIONS, DATABASE_URL, ...).
 */
import { loadConfig } from './config.js';
import { connect, openDatabase, resetSchema, truncateAll } from './database.js';
import { storm, VARIANTS, type VariantName } from './http-scenarios.js';
import { AppProcess } from './app-process.js';
import { median } from './stats.js';

async function main(): Promise<void> {
  const config = loadConfig();
  const variants = (process.env.BENCH_STORM_VARIANTS ?? 'module').split(',') as VariantName[];
  for (const variant of variants) if (!VARIANTS[variant]) throw new Error(`BENCH_STORM_VARIANTS: no route "${variant}".`);
  const log = (line: string) => console.log(line);
  const database = await openDatabase(log);
  try {
    await resetSchema(database.url, config.schema);
    const db = await connect(database.url, config.schema);
    try {
      const ratios = new Map<string, number[]>();
      for (let round = 1; round <= config.rounds; round++) {
        for (const adapter of config.adapters) {
          await truncateAll(db);
          const app = await AppProcess.start({
            adapter,
            databaseUrl: database.url,
            schema: config.schema,
            poolSize: config.poolSize,
          });
          try {
            for (const variant of variants) {
              for (const delayMs of config.stormDelaysMs) {
                const result = await storm(app, config, db, adapter, delayMs, log, variant);
                const ratio = result.latency.p99 / result.noDatabase.latency.p99;
                const name = `${variant} ${adapter} delay ${delayMs} ms`;
                log(`  round ${round} ${name}: p99 ${ratio.toFixed(2)}x the no-database route's; ok ${result.ok}`);
                ratios.set(name, [...(ratios.get(name) ?? []), ratio]);
              }
            }
          } finally {
            await app.close();
          }
        }
      }
      console.log('\n| storm | p99 / no-database route, each round | median |\n| --- | --- | --- |');
      for (const [name, values] of ratios)
        console.log(`| ${name} | ${values.map((v) => `${v.toFixed(2)}x`).join(', ')} | ${median(values).toFixed(2)}x |`);
    } finally {
      await db.end();
    }
  } finally {
    await database.stop();
  }
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});
