import { describe, expect, it } from '@jest/globals';
import type { IdempotencyOutcome } from '../core/observer.js';
import { OTHER_ROUTES, OutcomeHistory } from './outcome-history.js';

const outcome = (kind: IdempotencyOutcome, route = 'Charges.create') =>
  ({ type: 'outcome', outcome: kind, route, durationMs: 1 }) as const;

describe('OutcomeHistory', () => {
  it('counts per minute and per tenant, and forgets what left the window', () => {
    let now = Date.parse('2026-12-02T10:00:30Z');
    const history = new OutcomeHistory(60, 1_000, 100, () => now);
    history.record(outcome('executed'), 'a');
    history.record(outcome('replayed'), 'a');
    history.record(outcome('lease-lost'), 'b');
    now += 60_000;
    history.record(outcome('conflict'), 'a');

    const all = history.perMinute(null);
    expect(all).toHaveLength(60);
    expect(all[58]).toMatchObject({ minute: '2026-12-02T10:00:00.000Z', executed: 1, replayed: 1, 'lease-lost': 1 });
    expect(all[59]).toMatchObject({ minute: '2026-12-02T10:01:00.000Z', conflict: 1, executed: 0 });
    expect(history.perMinute('b')[58]).toMatchObject({ executed: 0, replayed: 0, 'lease-lost': 1 });
    expect(history.perMinute('nobody').every((m) => m.executed + m['lease-lost'] === 0)).toBe(true);

    now += 60 * 60_000;
    expect(history.perMinute(null).some((m) => m.executed > 0)).toBe(false);
    expect(history.perRoute(null)).toEqual([]);
  });

  it("counts each outcome under its own name: a handler's 5xx (key kept) is not lumped with the others", () => {
    const history = new OutcomeHistory(60, 10, 10, () => 0);
    for (const kind of ['kept', 'kept', 'failure-stored', 'released', 'error'] as const) history.record(outcome(kind), 'a');
    expect(history.perRoute('a')).toEqual([
      expect.objectContaining({ route: 'Charges.create', kept: 2, 'failure-stored': 1, released: 1, error: 1, executed: 0 }),
    ]);
    expect(history.perRoute('a')[0]).not.toHaveProperty('other');
  });

  it('keeps its memory bounded: tenants and routes past the bounds still count in the every-tenant view', () => {
    const history = new OutcomeHistory(60, 2, 1, () => 0);
    history.record(outcome('executed', 'r1'), 'a');
    history.record(outcome('executed', 'r2'), 'a');
    history.record(outcome('executed', 'r1'), 'b');
    history.record(outcome('executed', 'r1'), 'c');
    expect(history.perRoute('a')).toEqual([
      expect.objectContaining({ route: 'r1', executed: 1 }),
      expect.objectContaining({ route: OTHER_ROUTES, executed: 1 }),
    ]);
    expect(history.perRoute('c')).toEqual([]);
    expect(history.perMinute(null)[59].executed).toBe(4);
  });

  it('ignores events that are not outcomes', () => {
    const history = new OutcomeHistory(60, 10, 10, () => 0);
    history.record({ type: 'sweep', ran: true, failed: false, deleted: 1, batches: 1, durationMs: 1 }, undefined);
    expect(history.perRoute(null)).toEqual([]);
  });
});
