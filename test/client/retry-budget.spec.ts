import { describe, expect, it } from '@jest/globals';
import { IdempotencyConfigurationError, RetryBudget } from '../../src/client/index.js';
import { ManualClock } from './support/manual-clock.js';

function budget(options: { ratio?: number; minRetries?: number; window?: number } = {}) {
  const clock = new ManualClock();
  return { clock, budget: new RetryBudget({ clock, ...options }) };
}

/** Spends retries until the budget refuses; how many it allowed. */
function drain(b: RetryBudget): number {
  let allowed = 0;
  while (b.tryRetry()) allowed++;
  return allowed;
}

describe('RetryBudget', () => {
  it('allows the floor with no traffic at all, then refuses', () => {
    const { budget: b } = budget({ minRetries: 3, ratio: 0.2 });
    expect(drain(b)).toBe(3);
    expect(b.tryRetry()).toBe(false);
  });

  it('adds ratio of a retry per request made in the window', () => {
    const { budget: b } = budget({ minRetries: 2, ratio: 0.25 });
    for (let i = 0; i < 10; i++) b.recordRequest();
    // 2 + 0.25 x 10 = 4.5: four whole retries.
    expect(drain(b)).toBe(4);
    b.recordRequest();
    b.recordRequest();
    // 2 + 0.25 x 12 = 5, 4 spent.
    expect(drain(b)).toBe(1);
  });

  it('under a total outage, retries stay within floor + ratio x requests, however many each request would make', () => {
    const { budget: b } = budget({ minRetries: 10, ratio: 0.2, window: 60_000 });
    let retries = 0;
    for (let request = 0; request < 1_000; request++) {
      b.recordRequest();
      // Each request would retry up to 9 times.
      for (let attempt = 1; attempt < 10 && b.tryRetry(); attempt++) retries++;
    }
    expect(retries).toBe(10 + 0.2 * 1_000);
  });

  it('forgets retries and requests once they slide out of the window', () => {
    const { clock, budget: b } = budget({ minRetries: 2, ratio: 1, window: 10_000 });
    b.recordRequest();
    expect(drain(b)).toBe(3);
    clock.advance(5_000);
    // Still inside the window: nothing came back.
    expect(b.tryRetry()).toBe(false);
    clock.advance(5_000);
    // The slice holding the request and the three retries has left the window: the floor is back, the request's share is gone.
    expect(b.available()).toBe(2);
    expect(drain(b)).toBe(2);
  });

  it('slides a tenth of the window at a time', () => {
    const { clock, budget: b } = budget({ minRetries: 0, ratio: 1, window: 10_000 });
    b.recordRequest();
    clock.advance(1_000);
    b.recordRequest();
    expect(b.available()).toBe(2);
    clock.advance(9_000);
    // The first second's slice is out, the second's is not.
    expect(b.available()).toBe(1);
    clock.advance(1_000);
    expect(b.available()).toBe(0);
  });

  it('has documented defaults: 20 % of requests, at least 10 per 10 s', () => {
    const { budget: b } = budget();
    expect({ ratio: b.ratio, minRetries: b.minRetries, window: b.window }).toEqual({
      ratio: 0.2,
      minRetries: 10,
      window: 10_000,
    });
  });

  it.each([
    [{ ratio: -0.1 }],
    [{ ratio: 1.5 }],
    [{ ratio: Number.NaN }],
    [{ minRetries: 1.5 }],
    [{ minRetries: -1 }],
    [{ window: 0 }],
    [{ window: 5 }],
  ])('refuses %p, saying what it expects', (options) => {
    expect(() => new RetryBudget(options)).toThrow(IdempotencyConfigurationError);
  });
});
