/**
 * The claim race suites (the state table, concurrent duplicates and faults,
 * takeovers and the heartbeat, request-transaction mode, the attempt
 * lifecycle, the sweeper's races, the handler outcomes, phases and derived
 * keys across takeovers, the operator board's queries) run again here, unchanged, against the
 * partitioned key table: each suite reads the table kind from
 * support/key-table.ts when it creates its tables and boots its apps.
 */
import { useKeyTable } from './support/key-table.js';

useKeyTable('partitioned');
await import('./state-table.e2e.spec.js');
await import('./concurrency.e2e.spec.js');
await import('./fast-path.e2e.spec.js');
await import('./lifecycle.e2e.spec.js');
await import('./sweeper.e2e.spec.js');
await import('./outcomes.e2e.spec.js');
await import('./partial-failure.e2e.spec.js');
await import('./board.e2e.spec.js');
