/**
 * `nest-idempotency-pg/outbox`: the transactional outbox. IdempotencyModule provides
 * `Outbox` (enqueue in the handler's transaction) and `OutboxRelay` (delivers what
 * committed) to every app; this entry names them, their types and the outbox table's
 * migration, so an app that does not use the outbox imports none of it.
 */
export { Outbox, type EnqueueOptions } from './outbox.js';
export { OutboxRelay, type OutboxHandler, type RelayReport } from './outbox-relay.js';
export type { OutboxStore, OutboxMessage } from './outbox.store.js';
export { createOutboxMigration, CreateOutboxMessages1764547200000 } from './outbox.migration.js';
export type { OutboxOptions, OutboxRelayOptions } from '../idempotency.options.js';
