import { createHash, randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { DataSource } from 'typeorm';
import { DEFAULT_LEASE_MS, DEFAULT_TTL_MS } from '../src/idempotency.constants.js';
import { PostgresIdempotencyStore } from '../src/index.js';
import { FILL_TENANTS, KEY_TABLE, type ExistingKey } from './database.js';
import { summarize, type LatencySummary } from './stats.js';

export interface ClaimProbe {
  /** New keys: the INSERT path of the claim. */
  newKeys: LatencySummary;
  /** Completed keys: the path that reads and returns the stored response. */
  replays: LatencySummary;
  /** Claims that did not answer as expected (a new key not claimed, a replay not completed). */
  unexpected: number;
  /** Claims that could not start on time because `maxInFlight` were already waiting. */
  skipped: number;
  seconds: number;
}

/** The library's store on a TypeORM data source of the runner's own, for the scenarios that need no HTTP. */
export async function openStore(
  url: string,
  schema: string,
  poolSize: number,
  storeOptions: { partitioned?: boolean } = {},
): Promise<{ store: PostgresIdempotencyStore; close(): Promise<void> }> {
  const dataSource = new DataSource({
    type: 'postgres',
    url,
    schema,
    applicationName: 'idempotency-bench-runner',
    extra: { options: `-c search_path=${schema}`, max: poolSize, connectionTimeoutMillis: 10_000 },
  });
  await dataSource.initialize();
  return { store: new PostgresIdempotencyStore(dataSource, KEY_TABLE, storeOptions), close: () => dataSource.destroy() };
}

/**
 * Claims at a fixed rate (open loop: a slow claim does not slow the next
 * ones down), alternating new keys and replays of `existing`, until
 * `seconds` pass or `until` settles. A fixed rate below saturation measures
 * latency rather than how much CPU is left over, which is what a table-size
 * or sweep effect would change.
 */
export async function probeClaims(
  store: PostgresIdempotencyStore,
  existing: ExistingKey[],
  options: { rate: number; seconds?: number; until?: Promise<unknown>; maxInFlight?: number },
): Promise<ClaimProbe> {
  const newKeys: number[] = [];
  const replays: number[] = [];
  let unexpected = 0;
  let skipped = 0;
  let inFlight = 0;
  let issued = 0;
  let done = false;
  void options.until?.finally(() => (done = true));
  const maxInFlight = options.maxInFlight ?? 64;
  const started = performance.now();
  const pending = new Set<Promise<void>>();

  let failure: unknown;
  const claimOnce = async (replay: boolean) => {
    const target = replay ? existing[issued % existing.length] : newKey();
    const t0 = performance.now();
    try {
      const result = await store.claim({
        tenant: target.tenant,
        key: target.key,
        fingerprint: target.fingerprint,
        ownerToken: randomUUID(),
        leaseMs: DEFAULT_LEASE_MS,
        ttlMs: DEFAULT_TTL_MS,
      });
      (replay ? replays : newKeys).push(performance.now() - t0);
      if (result.state !== (replay ? 'completed' : 'claimed')) unexpected++;
    } catch (error) {
      failure ??= error;
      unexpected++;
    }
  };

  while (!done) {
    const elapsed = (performance.now() - started) / 1000;
    if (options.seconds !== undefined && elapsed >= options.seconds) break;
    const due = Math.floor(elapsed * options.rate) - issued;
    for (let i = 0; i < due; i++) {
      issued++;
      if (inFlight >= maxInFlight) {
        skipped++;
        continue;
      }
      inFlight++;
      const replay = existing.length > 0 && issued % 2 === 0;
      const claim = claimOnce(replay).finally(() => {
        inFlight--;
        pending.delete(claim);
      });
      pending.add(claim);
    }
    await sleep(2);
  }
  await Promise.all(pending);
  if (failure) throw new Error('A probe claim failed', { cause: failure });
  return {
    newKeys: summarize(newKeys),
    replays: summarize(replays),
    unexpected,
    skipped,
    seconds: Math.round(performance.now() - started) / 1000,
  };
}

/** A key as a client would send one: a random UUID, in one of the filled tenants. */
function newKey(): ExistingKey {
  const key = randomUUID();
  return {
    tenant: `tenant-${Math.floor(Math.random() * FILL_TENANTS)}`,
    key,
    fingerprint: createHash('sha256').update(key).digest('hex'),
  };
}
