/**
 * The CPU the fingerprint alone costs, in this process, with no HTTP and no
 * database: `tsc -p tsconfig.bench.json && node dist-bench/bench/fingerprint-cost.js [fingerprint.js]`.
 *
 * Times `fingerprintRequest` on the bench's ~1 MiB body (scenario 11) and on
 * its small charge, by the process's CPU time (user + system, which counts the
 * page faults of large allocations that wall time on a busy machine hides
 * among other processes' work), and prints the median and the quartiles of
 * many runs. The optional argument is the path of another tree's compiled
 * `fingerprint.js`, so two versions can be run alternately on the same body.
 *
 * Env: FINGERPRINT_RUNS (big body, 200), FINGERPRINT_SMALL_RUNS (20 batches of 20,000).
 */
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { loadConfig } from './config.js';
import { bigBody, BODY } from './http-scenarios.js';

type Fingerprint = (input: { method: string; route: string; params: object; query: object; body: unknown }) => string;

async function main(): Promise<void> {
  const path = process.argv[2] ? pathToFileURL(resolve(process.argv[2])).href : '../src/core/fingerprint.js';
  const { fingerprintRequest } = (await import(path)) as { fingerprintRequest: Fingerprint };
  const config = loadConfig();
  // Parsed once per request in the app: a fresh parse per run here too, outside the timed part.
  const bigText = bigBody(config.bigBodyBytes);
  const input = (body: unknown) => ({ method: 'POST', route: '/idem/charges', params: {}, query: {}, body });

  const runs = Number(process.env.FINGERPRINT_RUNS ?? 200);
  const big: number[] = [];
  for (let i = 0; i < runs + 10; i++) {
    const body: unknown = JSON.parse(bigText);
    const before = process.cpuUsage();
    fingerprintRequest(input(body));
    const spent = process.cpuUsage(before);
    if (i >= 10) big.push((spent.user + spent.system) / 1000);
  }

  const batches = Number(process.env.FINGERPRINT_SMALL_RUNS ?? 20);
  const small: number[] = [];
  const bodies = Array.from({ length: 20_000 }, () => JSON.parse(BODY) as unknown);
  for (let i = 0; i < batches + 2; i++) {
    const before = process.cpuUsage();
    for (const body of bodies) fingerprintRequest(input(body));
    const spent = process.cpuUsage(before);
    if (i >= 2) small.push((spent.user + spent.system) / bodies.length);
  }

  console.log(`fingerprint of the ${Buffer.byteLength(bigText)}-byte body: ${quartiles(big, 'ms')} (${runs} runs)`);
  console.log(`fingerprint of the small charge: ${quartiles(small, 'µs')} (${batches} batches of ${bodies.length})`);
}

function quartiles(values: number[], unit: string): string {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))].toFixed(2);
  return `median ${at(0.5)} ${unit} (quartiles ${at(0.25)}-${at(0.75)})`;
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
