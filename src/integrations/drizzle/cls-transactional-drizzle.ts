import type { EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { messages } from '../../errors/messages.js';
import { loadOptionalPackage } from '../../outbound/optional-package.js';
import type { AppTransactionManager } from '../../transaction/app-transaction-manager.js';
import { DrizzleBinding } from './drizzle-binding.js';
import { drizzleMessages } from './messages.js';

export interface ClsTransactionalDrizzleOptions {
  /**
   * The `connectionName` given to `ClsPluginTransactional`, when the app
   * registers several. Default: the plugin's default (unnamed) one.
   */
  connectionName?: string;
}

/**
 * What the module uses of `@nestjs-cls/transactional`'s `TransactionHost`:
 * `tx` outside a transaction is the adapter's fallback (the app's Drizzle
 * database); `setTxInstance` is what the host itself calls when it opens a
 * transaction, not part of its typed API, so `setUp` checks it is there.
 */
interface Host {
  readonly tx: unknown;
  setTxInstance(tx: unknown): void;
}

interface ClsTransactionalPackage {
  TransactionHost: { getInstance(connectionName?: string): Host };
}

interface ClsPackage {
  ClsServiceManager: {
    getClsService(): { run<T>(options: { ifNested: 'inherit' }, callback: () => T): T };
  };
}

const WHO = 'clsTransactionalDrizzle()';

/**
 * `@nestjs-cls/transactional` with its Drizzle adapter
 * (`@nestjs-cls/transactional-adapter-drizzle-orm`), set up as its docs say,
 * joined to the module's transaction: in an idempotent handler,
 * `TransactionHost#tx` is a Drizzle transaction on the module's connection
 * (the one `DrizzleTransactionHost#db` gives), so `@Transactional()` methods
 * with the default propagation (`Required`) write in the transaction that
 * completes the key, and `Propagation.Nested` opens a savepoint in it.
 *
 * ```ts
 * IdempotencyModule.forRoot({ tenant: (ctx) => ..., transactionManager: clsTransactionalDrizzle() })
 * ```
 *
 * Outside idempotent handlers nothing changes. Its packages and drizzle-orm
 * are loaded at start-up, only by this; the app's Drizzle database is the
 * one the plugin's adapter manages.
 */
export function clsTransactionalDrizzle(options: ClsTransactionalDrizzleOptions = {}): AppTransactionManager {
  const { connectionName } = options;
  let host: Host | undefined;
  let binding: DrizzleBinding | undefined;
  let cls: ReturnType<ClsPackage['ClsServiceManager']['getClsService']> | undefined;
  return {
    async setUp() {
      const transactional = await loadOptionalPackage<ClsTransactionalPackage>(
        '@nestjs-cls/transactional',
        drizzleMessages.clsMissing,
      );
      const clsPackage = await loadOptionalPackage<ClsPackage>('nestjs-cls', drizzleMessages.clsMissing);
      let found: Host;
      try {
        found = transactional.TransactionHost.getInstance(connectionName);
      } catch {
        throw new IdempotencyConfigurationError(drizzleMessages.clsNoHost(connectionName));
      }
      if (typeof found.setTxInstance !== 'function') throw new IdempotencyConfigurationError(drizzleMessages.clsUnsupported);
      // At start-up no transaction is active, so `tx` is the adapter's fallback: the Drizzle database it manages.
      binding = await DrizzleBinding.of(found.tx, WHO);
      host = found;
      cls = clsPackage.ClsServiceManager.getClsService();
    },
    join<T>(manager: EntityManager, work: () => Promise<T>): Promise<T> {
      // The module sets its transaction manager up at start-up; joining nothing would let writes commit on their own.
      if (!host || !binding || !cls) throw new IdempotencyConfigurationError(messages.transactionManager.notSetUp(WHO));
      const active = host;
      const tx = binding.transactionOf(manager);
      // A child of the request's CLS context (or a new one): the transaction is set for this work only.
      return cls.run({ ifNested: 'inherit' }, async () => {
        active.setTxInstance(tx);
        try {
          return await work();
        } finally {
          active.setTxInstance(undefined);
        }
      });
    },
  };
}
