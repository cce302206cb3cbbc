import { expect } from '@jest/globals';
import { sleep, type RawResponse } from '../../support/http.js';
import { answerLabel, chargeBody, isConflictWithRetryAfter, postCharge } from './charges.js';
import { tally } from './figures.js';
import type { SampleProcess } from './sample-process.js';
import type { ScenarioDatabase } from './scenario-database.js';

export interface StormFigures {
  requests: number;
  processes: number;
  answers: Record<string, number>;
  charges: number;
  duplicateCharges: number;
  byteIdenticalReplays: number;
  conflictsWithRetryAfter: number;
}

/**
 * Fires `requests` identical POST /charges (one key, one body) concurrently,
 * spread round-robin over `instances`, and checks what the database and the
 * clients saw: exactly one charge row; one original 201 naming it; every other
 * answer a 409 with Retry-After or a byte-identical replay of that 201. Then
 * each instance replays it once more.
 */
export async function runStorm(
  label: string,
  instances: SampleProcess[],
  db: ScenarioDatabase,
  requests = 200,
): Promise<StormFigures> {
  const customer = `cus-${label}-${Date.now()}`;
  const key = `storm-${label}-${Date.now()}`;
  // A slow processor keeps the winner in flight while the rest arrive; the
  // starts are spread over ~0.6 s so later duplicates meet the completed key.
  const body = chargeBody(customer, { delayMs: 250 });
  const answers = await Promise.all(
    Array.from({ length: requests }, async (_, i) => {
      await sleep((i % 10) * 60);
      return postCharge(instances[i % instances.length].url, key, body).catch((error: Error) => error);
    }),
  );
  const transportErrors = answers.filter((answer): answer is Error => answer instanceof Error);
  expect(transportErrors.map((error) => error.message)).toEqual([]);
  const responses = answers as RawResponse[];

  const originals = responses.filter((res) => res.status === 201 && res.headers['idempotent-replayed'] === undefined);
  expect(originals).toHaveLength(1);
  const original = originals[0];
  const charges = await db.chargeIds(customer);
  expect(charges).toEqual([original.json().id]);

  let byteIdenticalReplays = 0;
  let conflictsWithRetryAfter = 0;
  const unexpected: string[] = [];
  for (const res of responses) {
    if (res === original) continue;
    if (isConflictWithRetryAfter(res)) {
      conflictsWithRetryAfter++;
    } else if (isByteIdenticalReplay(res, original)) {
      byteIdenticalReplays++;
    } else {
      unexpected.push(`${res.status} ${res.text().slice(0, 200)}`);
    }
  }
  expect(unexpected).toEqual([]);
  expect(byteIdenticalReplays + conflictsWithRetryAfter).toBe(requests - 1);

  // Afterwards every instance, whichever ran the handler, replays the same bytes.
  for (const instance of instances) {
    const again = await postCharge(instance.url, key, body);
    expect(isByteIdenticalReplay(again, original)).toBe(true);
  }
  const row = await db.keyRow(key);
  // One claim and no takeover: the key was never given to a second attempt.
  expect({ status: row.status, attempt: row.attempt }).toEqual({ status: 'completed', attempt: 1 });
  expect(await db.chargeIds(customer)).toHaveLength(1);

  const { rows } = await db.client.query<{ count: string }>(
    'SELECT count(*) FROM (SELECT customer FROM charges GROUP BY customer HAVING count(*) > 1) AS duplicated',
  );
  return {
    requests,
    processes: instances.length,
    answers: tally(responses.map(answerLabel)),
    charges: charges.length,
    duplicateCharges: Number(rows[0].count),
    byteIdenticalReplays,
    conflictsWithRetryAfter,
  };
}

function isByteIdenticalReplay(res: RawResponse, original: RawResponse): boolean {
  return (
    res.status === original.status &&
    res.headers['idempotent-replayed'] === 'true' &&
    Buffer.compare(res.body, original.body) === 0 &&
    res.headers.location === original.headers.location &&
    res.headers['content-type'] === original.headers['content-type']
  );
}
