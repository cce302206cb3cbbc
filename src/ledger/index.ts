/**
 * `nest-idempotency-pg/ledger`: the effect ledger. IdempotencyModule provides
 * `EffectLedger` (record an effect once per business key, in the handler's
 * transaction) to every app; this entry names it, its types and its table's migration.
 */
export { EffectLedger, EffectLedgerUsageError, type EffectKeyOptions } from './effect-ledger.js';
export { createEffectLedgerMigration, CreateEffectLedger1764806400000 } from './effect-ledger.migration.js';
export type { EffectLedgerOptions } from '../idempotency.options.js';
