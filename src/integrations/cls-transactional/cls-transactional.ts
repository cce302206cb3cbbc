import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { messages } from '../../errors/messages.js';
import { clsTransactionalMessages } from './messages.js';
import { loadOptionalPackage } from '../../outbound/optional-package.js';
import type { AppTransactionManager } from '../../transaction/app-transaction-manager.js';

export interface ClsTransactionalOptions {
  /**
   * The `connectionName` given to `ClsPluginTransactional`, when the app
   * registers several. Default: the plugin's default (unnamed) one.
   */
  connectionName?: string;
}

/**
 * What the module uses of `@nestjs-cls/transactional`'s `TransactionHost`:
 * `setTxInstance` is what the host itself calls when it opens a transaction
 * (it also feeds `@InjectTransaction()`'s proxy); it is not part of the
 * typed API, so `setUp` checks it is there.
 */
interface Host {
  readonly tx: unknown;
  setTxInstance(tx: EntityManager | undefined): void;
}

interface ClsTransactionalPackage {
  TransactionHost: { getInstance(connectionName?: string): Host };
}

interface ClsPackage {
  ClsServiceManager: {
    getClsService(): { run<T>(options: { ifNested: 'inherit' }, callback: () => T): T };
  };
}

const INSTALL = clsTransactionalMessages.missing;

/**
 * `@nestjs-cls/transactional` (with its TypeORM adapter), set up as its docs
 * say, joined to the module's transaction: in an idempotent handler,
 * `TransactionHost#tx` is the module's transaction and `@Transactional()`
 * methods with the default propagation (`Required`) run in it, so their
 * writes commit or roll back with the key's completion.
 *
 * ```ts
 * IdempotencyModule.forRoot({ tenant: (ctx) => ..., transactionManager: clsTransactional() })
 * ```
 *
 * Outside idempotent handlers nothing changes. `nestjs-cls` and
 * `@nestjs-cls/transactional` are loaded at start-up, only by this.
 */
export function clsTransactional(options: ClsTransactionalOptions = {}): AppTransactionManager {
  const { connectionName } = options;
  let host: Host | undefined;
  let cls: ReturnType<ClsPackage['ClsServiceManager']['getClsService']> | undefined;
  return {
    async setUp(dataSource: DataSource) {
      const transactional = await loadOptionalPackage<ClsTransactionalPackage>('@nestjs-cls/transactional', INSTALL);
      const clsPackage = await loadOptionalPackage<ClsPackage>('nestjs-cls', INSTALL);
      let found: Host;
      try {
        found = transactional.TransactionHost.getInstance(connectionName);
      } catch {
        throw new IdempotencyConfigurationError(clsTransactionalMessages.noHost(connectionName));
      }
      if (typeof found.setTxInstance !== 'function') {
        throw new IdempotencyConfigurationError(clsTransactionalMessages.unsupported);
      }
      // At start-up no transaction is active, so `tx` is the adapter's fallback: the manager of the data source it manages.
      if ((found.tx as { connection?: unknown } | undefined)?.connection !== dataSource) {
        throw new IdempotencyConfigurationError(clsTransactionalMessages.otherDataSource(connectionName));
      }
      host = found;
      cls = clsPackage.ClsServiceManager.getClsService();
    },
    join<T>(manager: EntityManager, work: () => Promise<T>): Promise<T> {
      // The module sets its transaction manager up at start-up; joining nothing would let writes commit on their own.
      if (!host || !cls) throw new IdempotencyConfigurationError(messages.transactionManager.notSetUp('clsTransactional()'));
      const active = host;
      // A child of the request's CLS context (or a new one): the transaction is set for this work only.
      return cls.run({ ifNested: 'inherit' }, async () => {
        active.setTxInstance(manager);
        try {
          return await work();
        } finally {
          active.setTxInstance(undefined);
        }
      });
    },
  };
}
