import { describe, expect, it } from '@jest/globals';
import { fullJitterDelay, retryAfterMs } from '../../src/client/index.js';

describe('fullJitterDelay', () => {
  const options = { initialDelay: 100, maxDelay: 1_000 };

  it('draws each wait from [0, ceiling), the ceiling doubling per retry up to maxDelay', () => {
    const ceilings = [1, 2, 3, 4, 5, 6, 20].map((retry) => fullJitterDelay(retry, options, () => 0.999_999));
    expect(ceilings).toEqual([99, 199, 399, 799, 999, 999, 999]);
    expect([1, 4, 20].map((retry) => fullJitterDelay(retry, options, () => 0))).toEqual([0, 0, 0]);
  });

  it('spreads clients that failed together over the whole range, not around one point', () => {
    let seed = 7;
    const random = () => (seed = (seed * 48_271) % 2_147_483_647) / 2_147_483_647;
    const waits = Array.from({ length: 2_000 }, () => fullJitterDelay(4, options, random));
    expect(Math.min(...waits)).toBeLessThan(40);
    expect(Math.max(...waits)).toBeGreaterThan(760);
    const lowerHalf = waits.filter((w) => w < 400).length;
    expect(lowerHalf / waits.length).toBeGreaterThan(0.45);
    expect(lowerHalf / waits.length).toBeLessThan(0.55);
  });

  it('does not overflow for a huge retry number', () => {
    expect(fullJitterDelay(5_000, options, () => 0.5)).toBe(500);
  });
});

describe('retryAfterMs', () => {
  const now = Date.UTC(2026, 0, 1, 12, 0, 0);

  it.each<[string | null, number | undefined]>([
    ['0', 0],
    ['3', 3_000],
    [' 12 ', 12_000],
    ['Thu, 01 Jan 2026 12:00:05 GMT', 5_000],
    ['Thu, 01 Jan 2026 11:00:00 GMT', 0],
    [null, undefined],
    ['', undefined],
    ['1.5', undefined],
    ['-1', undefined],
    ['2026-01-01T12:00:05Z', undefined],
    ['soon', undefined],
  ])('reads %p as %p ms', (value, expected) => {
    expect(retryAfterMs(value, now)).toBe(expected);
  });
});
