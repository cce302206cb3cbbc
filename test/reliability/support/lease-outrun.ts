import { expect } from '@jest/globals';
import { ProblemType } from '../../../src/index.js';
import { sleep } from '../../support/http.js';
import { answerLabel, chargeBody, isConflictWithRetryAfter, postCharge, problemType } from './charges.js';
import { tally } from './figures.js';
import type { SampleProcess } from './sample-process.js';
import type { ScenarioDatabase } from './scenario-database.js';

/** The lease to start both processes with (`IDEMPOTENCY_LEASE_MS`). */
export const OUTRUN_LEASE_MS = 2_500;
/**
 * The handler's simulated work, the same for both attempts (the body is the
 * fingerprint): longer than the lease, so the takeover sent once the lease
 * ended starts while the original still runs (1.5 s of margin), and shorter
 * than twice the lease, so the original ends while the takeover's own lease
 * still holds (about 1 s of margin) and requests sent then get 409.
 */
const HANDLER_MS = OUTRUN_LEASE_MS + 1_500;

/**
 * Runs the lease-outrun scenario on one pair of processes started with
 * `OUTRUN_LEASE_MS`: a slow original on `slow`, a takeover on `takeover` once the lease
 * ended by the database clock. Both executions write a charge row; only the
 * takeover's commits; the original answers 409 lease-lost. Returns what it measured.
 */
export async function outrunLease(
  db: ScenarioDatabase,
  slow: SampleProcess,
  takeover: SampleProcess,
): Promise<Record<string, number | Record<string, number>>> {
  const customer = `cus-outrun-${slow.adapter}-${Date.now()}`;
  const key = `outrun-${slow.adapter}-${Date.now()}`;
  const body = chargeBody(customer, { delayMs: HANDLER_MS });
  const original = postCharge(slow.url, key, body);

  expect(await db.waitForUncommittedChargeInserts(1)).toBe(true);
  const first = await db.keyRow(key);
  // Wait for the lease to end by the database clock, the only clock the module uses.
  const { rows } = await db.client.query<{ ms: number }>(
    'SELECT GREATEST(0, EXTRACT(EPOCH FROM ($1 - now())) * 1000)::float8 AS ms',
    [first.lease_expires_at],
  );
  await sleep(rows[0].ms + 100);
  const retry = postCharge(takeover.url, key, body);

  // Both executions have inserted a charge row in their own open transaction.
  expect(await db.waitForUncommittedChargeInserts(2)).toBe(true);
  const executionsSeen = await db.uncommittedChargeInserts();
  expect(executionsSeen).toBe(2);

  const lost = await original;
  expect(lost.status).toBe(409);
  expect(lost.headers['content-type']).toMatch(/^application\/problem\+json/);
  expect(problemType(lost)).toBe(ProblemType.leaseLost);
  expect(lost.text()).not.toContain('"ch_');

  // The takeover still runs: its key is in flight on either process.
  const whileRunning = await Promise.all([postCharge(slow.url, key, body), postCharge(takeover.url, key, body)]);
  expect(whileRunning.filter((res) => !isConflictWithRetryAfter(res)).map(answerLabel)).toEqual([]);

  const won = await retry;
  expect(won.status).toBe(201);
  expect(won.headers['idempotent-replayed']).toBeUndefined();
  const charges = await db.chargeIds(customer);
  // The slow original's row is gone; the only charge is the one the takeover answered with.
  expect(charges).toEqual([won.json().id]);
  const row = await db.keyRow(key);
  expect({ status: row.status, attempt: row.attempt }).toEqual({ status: 'completed', attempt: 2 });

  const replays = await Promise.all([postCharge(slow.url, key, body), postCharge(takeover.url, key, body)]);
  for (const res of replays) {
    expect(res.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(res.body, won.body)).toBe(0);
  }
  return {
    'requests sent': 2 + whileRunning.length + replays.length,
    'executions that wrote a row': executionsSeen,
    answers: tally([lost, won, ...whileRunning, ...replays].map(answerLabel)),
    'charges in the end': charges.length,
    duplicates: charges.length - 1,
  };
}
