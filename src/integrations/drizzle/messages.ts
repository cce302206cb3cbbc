/** `nest-idempotency-pg/drizzle`: what start-up and a misused transaction say. */
export const drizzleMessages = {
  missing: 'nest-idempotency-pg/drizzle needs drizzle-orm (0.45) on node-postgres: npm i drizzle-orm pg.',
  notNodePostgres: (who: string) =>
    `${who}: the database given is not a Drizzle database on node-postgres. Give the one drizzle() of ` +
    "'drizzle-orm/node-postgres' returns (e.g. drizzle(pool, { schema })); other drivers are not supported.",
  noConnection:
    "nest-idempotency-pg/drizzle: the idempotent execution's transaction has no node-postgres connection to bind Drizzle " +
    "to: its EntityManager has no connected query runner. A store of one's own must give the work the EntityManager of a " +
    'TypeORM postgres query runner in its transaction.',
  ended:
    "A Drizzle transaction of an idempotent execution was used after that execution's transaction ended (or outside " +
    'it): its statements would run on a connection another request may hold. Read DrizzleTransactionHost#db (or ' +
    "@nestjs-cls/transactional's TransactionHost#tx) again where the statement runs, rather than keeping it.",
  clsMissing:
    'clsTransactionalDrizzle() needs nestjs-cls and @nestjs-cls/transactional with its Drizzle adapter: ' +
    'npm i nestjs-cls @nestjs-cls/transactional @nestjs-cls/transactional-adapter-drizzle-orm.',
  clsNoHost: (connectionName: string | undefined) =>
    `clsTransactionalDrizzle(): no TransactionHost${connectionName ? ` for connectionName "${connectionName}"` : ''} is ` +
    'registered. Register the plugin as its docs say: ClsModule.forRoot({ global: true, plugins: [new ' +
    `ClsPluginTransactional({ imports: [DrizzleModule], ${connectionName ? `connectionName: '${connectionName}', ` : ''}` +
    'adapter: new TransactionalAdapterDrizzleOrm({ drizzleInstanceToken: DRIZZLE }) })] }), and give ' +
    'clsTransactionalDrizzle() the same connectionName.',
  clsUnsupported:
    'clsTransactionalDrizzle(): this version of @nestjs-cls/transactional has no TransactionHost#setTxInstance, which ' +
    'the module uses to make its transaction the active one. Use @nestjs-cls/transactional 3.x (3.3 is tested).',
} as const;
