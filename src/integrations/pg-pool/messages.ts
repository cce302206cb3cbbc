/** `idempotentPool()`: why a statement of the app's was refused inside an idempotent execution, and what to do instead. */
export const idempotentPoolMessages = {
  noConnection:
    "idempotentPool(): the idempotent execution's transaction has no connection to run the app's statements on " +
    '(its EntityManager has no QueryRunner). This is a bug of nest-idempotency-pg; please report it.',
  ended:
    "idempotentPool(): the idempotent execution's transaction has ended; a statement sent after it (from work the " +
    'handler left running) would run on a connection lent to someone else. Await all work before the handler returns.',
  released: 'idempotentPool(): this client was released; take another with pool.connect().',
  notAPool:
    'idempotentPool(): the pool given is not a pg.Pool of the pg that nest-idempotency-pg loads: the app has two copies of ' +
    "pg (npm ls pg), and an ORM's adapter (PrismaPg keeps an external pool only if it is an instance of its pg.Pool) may " +
    'not recognise the wrapper either. Install one version of pg (npm dedupe, or align the versions), and pass a pg.Pool.',
  otherDatabase: (app: string, module: string) =>
    `idempotentPool(): the app's pool reaches database "${app}", IdempotencyModule's data source "${module}" ` +
    "(or the same name on another server), so the app's writes could not be part of the key's transaction. Give the " +
    'pool and the data source the same database.',
  controlOnPool:
    "idempotentPool(): a transaction statement sent through pool.query() inside an idempotent execution would end the key's " +
    "transaction. Use the ORM's transactions (Prisma's $transaction), which become savepoints of it, or pool.connect().",
  controlRefused:
    "idempotentPool(): inside an idempotent execution the app's statements run in the key's transaction, which only the " +
    'module ends: BEGIN, COMMIT and ROLLBACK (each alone in its text) become savepoints of it; other transaction statements ' +
    '(COMMIT AND CHAIN, PREPARE TRANSACTION, SET TRANSACTION other than its isolation level, several statements in one ' +
    'text with one of them) are refused.',
  beginTwice:
    'idempotentPool(): BEGIN on a client whose transaction is already open. Open the next one after COMMIT or ROLLBACK.',
  otherIsolation: (asked: string, running: string) =>
    `idempotentPool(): the app asked for isolation level ${asked.toUpperCase()}, but the key's transaction, which the app's ` +
    `transaction joins as a savepoint, runs at ${running.toUpperCase()}. Ask for none (or the same) in idempotent handlers, ` +
    "or set the level for the key's transaction (the module's data source's isolationLevel).",
  overlapping:
    "idempotentPool(): a second transaction of the app's while one is open: inside an idempotent execution they share the " +
    "key's transaction's one connection, where the first one's ROLLBACK would undo the second one's COMMIT. Run them one " +
    "after the other (nest with the ORM's own nested transactions, which are savepoints of the open one).",
} as const;
