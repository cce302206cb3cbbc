import type { DataSourceOptions } from 'typeorm';
import { CreateIdempotencyKeys1764460800000 } from '../../src/index.js';
import { CreateEffectLedger1764806400000 } from '../../src/ledger/index.js';
import { CreateOutboxMessages1764547200000 } from '../../src/outbox/index.js';
import { ChargeEntity } from '../charges/charge.entity.js';
import { CreateCharges1764460900000 } from '../migrations/1764460900000-create-charges.js';
import { CreateOrders1764547300000 } from '../migrations/1764547300000-create-orders.js';
import { AddChargeRiskScore1764720000000 } from '../migrations/1764720000000-add-charge-risk-score.js';
import { AddProviderAccounts1764720100000 } from '../migrations/1764720100000-add-provider-accounts.js';
import { CreateRefunds1764806500000 } from '../migrations/1764806500000-create-refunds.js';
import { UpgradeIdempotencyKeys1767225600000 } from '../migrations/1767225600000-upgrade-idempotency-keys.js';

/** The app's TypeORM options: schema by migrations only, never `synchronize`. */
export function dataSourceOptions(url: string, schema: string | undefined): DataSourceOptions {
  return {
    type: 'postgres',
    url,
    schema,
    entities: [ChargeEntity],
    // The module's migration for `idempotency_keys` beside the app's own.
    migrations: [
      CreateIdempotencyKeys1764460800000,
      CreateCharges1764460900000,
      CreateOutboxMessages1764547200000,
      CreateOrders1764547300000,
      AddChargeRiskScore1764720000000,
      AddProviderAccounts1764720100000,
      CreateEffectLedger1764806400000,
      CreateRefunds1764806500000,
      UpgradeIdempotencyKeys1767225600000,
    ],
    // Run by runMigrationsSerialised() after initialisation, under a lock (see there).
    migrationsRun: false,
    synchronize: false,
    extra: {
      // The module's SQL and the migrations name tables unqualified: search_path places them in the schema.
      ...(schema ? { options: `-c search_path="${schema.replace(/"/g, '""')}"` } : {}),
      max: 20,
      connectionTimeoutMillis: 5_000,
      // node-postgres emits 'error' on a client whose connection dies; a pooled client has no listener of its own
      // for a moment after it connects, and an unhandled 'error' ends the process. This one keeps the app alive:
      // the query that was using the connection fails, and the module answers 503.
      onConnect: (client: { on(event: 'error', listener: () => void): unknown }) => {
        client.on('error', () => undefined);
      },
    },
  };
}
