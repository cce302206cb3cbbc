import { expect } from '@jest/globals';
import { sleep, type RawResponse } from '../../support/http.js';
import { answerLabel, chargeBody, isConflictWithRetryAfter, postCharge, transportFailure } from './charges.js';
import { tally } from './figures.js';
import type { SampleProcess } from './sample-process.js';
import type { ScenarioDatabase } from './scenario-database.js';

export interface StormFigures {
  requests: number;
  keys: number;
  processes: number;
  answers: Record<string, number>;
  charges: number;
  duplicateCharges: number;
  byteIdenticalReplays: number;
  conflictsWithRetryAfter: number;
}

/**
 * Fires `keys × copies` POST /charges concurrently, `copies` identical ones
 * (same key, same body) per key, spread round-robin over `instances`, and
 * checks what the database and the clients saw, key by key: exactly one
 * charge row; one original 201 naming it; every other answer a 409 with
 * Retry-After or a byte-identical replay of that 201. Then each instance
 * replays every key once more.
 */
export async function runStorm(
  label: string,
  instances: SampleProcess[],
  db: ScenarioDatabase,
  { keys = 1, copies = 200 }: { keys?: number; copies?: number } = {},
): Promise<StormFigures> {
  const run = Date.now();
  const intents = Array.from({ length: keys }, (_, k) => ({
    key: `storm-${label}-${run}-${k}`,
    // A slow processor keeps the winner in flight while the rest arrive.
    body: chargeBody(`cus-${label}-${run}-${k}`, { delayMs: 250 }),
  }));
  const outcomes = await Promise.all(
    Array.from({ length: keys * copies }, async (_, i) => {
      const intent = intents[i % keys];
      // Starts spread over ~0.6 s, so later duplicates meet the completed key.
      await sleep((Math.floor(i / keys) % 10) * 60);
      const outcome = await postCharge(instances[i % instances.length].url, intent.key, intent.body).catch(
        (error: unknown) => error,
      );
      return { intent, outcome };
    }),
  );
  const transportErrors = outcomes.map(({ outcome }) => transportFailure(outcome)).filter((failure) => failure !== undefined);
  expect(transportErrors).toEqual([]);

  let byteIdenticalReplays = 0;
  let conflictsWithRetryAfter = 0;
  let charges = 0;
  for (const intent of intents) {
    const responses = outcomes.filter((o) => o.intent === intent).map((o) => o.outcome as RawResponse);
    const originals = responses.filter((res) => res.status === 201 && res.headers['idempotent-replayed'] === undefined);
    expect({ key: intent.key, originals: originals.length }).toEqual({ key: intent.key, originals: 1 });
    const original = originals[0];
    const ids = await db.chargeIds(intent.body.customer);
    expect({ key: intent.key, charges: ids }).toEqual({ key: intent.key, charges: [original.json().id] });
    charges += ids.length;

    const unexpected: string[] = [];
    for (const res of responses) {
      if (res === original) continue;
      if (isConflictWithRetryAfter(res)) conflictsWithRetryAfter++;
      else if (isByteIdenticalReplay(res, original)) byteIdenticalReplays++;
      else unexpected.push(`${res.status} ${res.text().slice(0, 200)}`);
    }
    expect(unexpected).toEqual([]);

    // Afterwards every instance, whichever ran the handler, replays the same bytes.
    for (const instance of instances) {
      const again = await postCharge(instance.url, intent.key, intent.body);
      expect(isByteIdenticalReplay(again, original)).toBe(true);
    }
    const row = await db.keyRow(intent.key);
    // One claim and no takeover: the key was never given to a second attempt.
    expect({ status: row.status, attempt: row.attempt }).toEqual({ status: 'completed', attempt: 1 });
  }
  expect(byteIdenticalReplays + conflictsWithRetryAfter).toBe(keys * (copies - 1));

  return {
    requests: outcomes.length,
    keys,
    processes: instances.length,
    answers: tally(outcomes.map(({ outcome }) => answerLabel(outcome as RawResponse))),
    charges,
    duplicateCharges: await db.duplicateCharges(),
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
