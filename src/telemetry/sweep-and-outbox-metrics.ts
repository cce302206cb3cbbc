import type { IdempotencyEvent } from '../core/observer.js';
import type { OtelInstruments } from './otel-api.js';

/** Records the sweeper's and the outbox relay's events, which no request emits. */
export function recordSweepOrOutbox(
  event: Extract<IdempotencyEvent, { type: 'sweep' | 'outbox' }>,
  instruments: OtelInstruments,
) {
  const { sweepRuns, swept, sweepDuration, outbox } = instruments;
  switch (event.type) {
    case 'sweep':
      sweepRuns.add(1, { ran: event.ran, failed: event.failed });
      if (event.deleted > 0) swept.add(event.deleted);
      if (event.ran) sweepDuration.record(event.durationMs);
      return;
    case 'outbox':
      for (const result of ['delivered', 'retried', 'deadLettered', 'timedOut', 'unsettled'] as const) {
        if (event[result] > 0) outbox.add(event[result], { result });
      }
      return;
  }
}
