/** `clsTransactional()`: what start-up says when `@nestjs-cls/transactional` is missing or not set up for the module's data source. */
export const clsTransactionalMessages = {
  missing:
    'clsTransactional() needs nestjs-cls and @nestjs-cls/transactional with its TypeORM adapter: ' +
    'npm i nestjs-cls @nestjs-cls/transactional @nestjs-cls/transactional-adapter-typeorm.',
  noHost: (connectionName: string | undefined) =>
    `clsTransactional(): no TransactionHost${connectionName ? ` for connectionName "${connectionName}"` : ''} is registered. ` +
    'Register the plugin as its docs say: ClsModule.forRoot({ global: true, plugins: [new ClsPluginTransactional({ ' +
    `imports: [TypeOrmModule], ${connectionName ? `connectionName: '${connectionName}', ` : ''}adapter: new ` +
    'TransactionalAdapterTypeOrm({ dataSourceToken: getDataSourceToken() }) })] }), and give clsTransactional() the same ' +
    'connectionName.',
  unsupported:
    'clsTransactional(): this version of @nestjs-cls/transactional has no TransactionHost#setTxInstance, which the module ' +
    'uses to make its transaction the active one. Use @nestjs-cls/transactional 3.x (3.3 is tested).',
  otherDataSource: (connectionName: string | undefined) =>
    `clsTransactional(): the TransactionHost${connectionName ? ` "${connectionName}"` : ''} does not manage the data source ` +
    "IdempotencyModule uses, so its transactions could not be the module's. Give TransactionalAdapterTypeOrm the " +
    "dataSourceToken of the module's data source (getDataSourceToken(name) for IdempotencyModule's `dataSource`), or " +
    'name the right connectionName.',
} as const;
