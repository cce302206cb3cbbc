import { describe, expect, it } from '@jest/globals';
import { CompletedAnswers } from './completed-answers.js';
import type { StoredResponse } from './idempotency-store.js';

const response = (bytes: number): StoredResponse => ({ status: 201, headers: [], body: Buffer.alloc(bytes) });
const DAY = 86_400_000;

describe('CompletedAnswers', () => {
  it('keeps its bytes under maxBytes, the oldest out first, and refuses an answer larger than all of it', () => {
    const answers = new CompletedAnswers({ maxEntries: 100, maxBytes: 1_000, windowMs: 60_000 });
    const now = performance.now();
    answers.remember('t', 'a', 'f', response(400), DAY, now);
    answers.remember('t', 'b', 'f', response(400), DAY, now);
    answers.remember('t', 'c', 'f', response(400), DAY, now);
    expect(answers.get('t', 'a')).toBeUndefined();
    expect(answers.get('t', 'b')).toBeDefined();
    expect(answers.get('t', 'c')).toBeDefined();
    answers.remember('t', 'huge', 'f', response(2_000), DAY, now);
    expect(answers.get('t', 'huge')).toBeUndefined();
    expect(answers.get('t', 'c')).toBeDefined();
  });

  it('never keeps an answer past its TTL less the margin, nor past the window', () => {
    const answers = new CompletedAnswers({ maxEntries: 100, maxBytes: 1_000_000, windowMs: 60_000 });
    const now = performance.now();
    // 1 s + 1% of the TTL: nothing is left of a TTL of a second.
    answers.remember('t', 'short', 'f', response(1), 1_000, now);
    expect(answers.get('t', 'short')).toBeUndefined();
    // Completed 61 s ago by this process's clock: past the window.
    answers.remember('t', 'old', 'f', response(1), DAY, now - 61_000);
    expect(answers.get('t', 'old')).toBeUndefined();
    // Completed 1.2 s ago with a TTL of 2.5 s: 2.5 - 1.025 = 1.475 s of life, still there.
    answers.remember('t', 'young', 'f', response(1), 2_500, now - 1_200);
    expect(answers.get('t', 'young')).toBeDefined();
  });

  it('tells tenants apart, even when a tenant and a key could be joined the same way', () => {
    const answers = new CompletedAnswers({ maxEntries: 100, maxBytes: 1_000_000, windowMs: 60_000 });
    answers.remember('ab', 'c', 'f', response(1), DAY, performance.now());
    expect(answers.get('a', 'bc')).toBeUndefined();
    expect(answers.get('ab', 'c')?.fingerprint).toBe('f');
  });
});
