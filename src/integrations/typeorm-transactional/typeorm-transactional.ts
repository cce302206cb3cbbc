import { EventEmitter } from 'node:events';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { messages } from '../../errors/messages.js';
import { typeormTransactionalMessages } from './messages.js';
import { loadOptionalPackage } from '../../outbound/optional-package.js';
import type { AppTransactionManager, TransactionOutcome } from '../../transaction/app-transaction-manager.js';

export interface TypeormTransactionalOptions {
  /**
   * The name the data source was registered under with
   * `addTransactionalDataSource({ name, dataSource })`. Default `'default'`
   * (what `addTransactionalDataSource(dataSource)` registers).
   */
  dataSourceName?: string;
}

/** typeorm-transactional's storage (cls-hooked or AsyncLocalStorage, as it was initialised). */
interface Context {
  run<T>(callback: () => Promise<T>): Promise<T>;
}

/**
 * What the module uses of typeorm-transactional: the functions its own
 * `@Transactional()` uses to find and set the current `EntityManager` of a
 * data source and the hooks of `runOnTransactionCommit()`. They are not
 * exported from its root, so they are read from `dist/common` (0.5.0).
 */
interface Common {
  getTransactionalContext(): Context;
  getDataSourceByName(name: string): DataSource | undefined;
  setEntityManagerByDataSourceName(context: Context, name: string, manager: EntityManager | null): void;
  setHookInContext(context: Context, hook: EventEmitter): void;
  getTransactionalOptions(): { maxHookHandlers: number };
}

const COMMON = 'typeorm-transactional/dist/common/index.js';

/**
 * `typeorm-transactional`, set up as its docs say
 * (`initializeTransactionalContext()`, `addTransactionalDataSource()`),
 * joined to the module's transaction: in an idempotent handler its
 * `@Transactional()` methods with the default propagation (`REQUIRED`), and
 * the repositories it patches, run in the module's transaction, so their
 * writes commit or roll back with the key's completion.
 * `runOnTransactionCommit()`, `runOnTransactionRollback()` and
 * `runOnTransactionComplete()` there run once that transaction has ended.
 *
 * ```ts
 * IdempotencyModule.forRoot({ tenant: (ctx) => ..., transactionManager: typeormTransactional() })
 * ```
 *
 * Outside idempotent handlers nothing changes. `typeorm-transactional` is
 * loaded at start-up, only by this.
 */
export function typeormTransactional(options: TypeormTransactionalOptions = {}): AppTransactionManager {
  const name = options.dataSourceName ?? 'default';
  let common: Common | undefined;
  let context: Context | undefined;
  return {
    async setUp(dataSource: DataSource) {
      await loadOptionalPackage('typeorm-transactional', typeormTransactionalMessages.missing);
      const loaded = await loadOptionalPackage<Common>(COMMON, typeormTransactionalMessages.missing);
      try {
        context = loaded.getTransactionalContext();
      } catch {
        throw new IdempotencyConfigurationError(typeormTransactionalMessages.notInitialized);
      }
      const registered = loaded.getDataSourceByName(name);
      if (!registered) throw new IdempotencyConfigurationError(typeormTransactionalMessages.noDataSource(name));
      if (registered !== dataSource) {
        throw new IdempotencyConfigurationError(typeormTransactionalMessages.otherDataSource(name));
      }
      common = loaded;
    },
    join<T>(manager: EntityManager, work: () => Promise<T>, ended: Promise<TransactionOutcome>): Promise<T> {
      if (!common || !context) {
        throw new IdempotencyConfigurationError(messages.transactionManager.notSetUp('typeormTransactional()'));
      }
      const { setEntityManagerByDataSourceName, setHookInContext, getTransactionalOptions } = common;
      const storage = context;
      // Two levels, as its own @Transactional() does: with its AsyncLocalStorage driver, the first `run` outside any of
      // its contexts only establishes a store, and values set there are dropped.
      return storage.run(() =>
        storage.run(async () => {
          setEntityManagerByDataSourceName(storage, name, manager);
          setHookInContext(storage, hookUntil(ended, getTransactionalOptions().maxHookHandlers));
          try {
            return await work();
          } finally {
            setEntityManagerByDataSourceName(storage, name, null);
          }
        }),
      );
    },
  };
}

/**
 * The hooks `runOnTransactionCommit()` and its siblings register on, fired
 * once the module's transaction has ended, as typeorm-transactional fires
 * its own: `commit` after a COMMIT, `rollback` otherwise (also when the
 * COMMIT's answer was lost, as it does for a transaction that threw), then
 * `end`.
 */
function hookUntil(ended: Promise<TransactionOutcome>, maxListeners: number): EventEmitter {
  const hook = new EventEmitter();
  hook.setMaxListeners(maxListeners);
  void ended.then((outcome) =>
    setImmediate(() => {
      if (outcome === 'committed') {
        hook.emit('commit');
        hook.emit('end', undefined);
      } else {
        const error = new Error(`The idempotent handler's transaction did not commit (${outcome}).`);
        hook.emit('rollback', error);
        hook.emit('end', error);
      }
      hook.removeAllListeners();
    }),
  );
  return hook;
}
