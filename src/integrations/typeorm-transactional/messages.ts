/** `typeormTransactional()`: what start-up says when `typeorm-transactional` is missing or not set up for the module's data source. */
export const typeormTransactionalMessages = {
  missing: 'typeormTransactional() needs typeorm-transactional: npm i typeorm-transactional.',
  notInitialized:
    'typeormTransactional(): typeorm-transactional is not initialised. Call initializeTransactionalContext() before ' +
    'NestFactory.create(), and register the data source with addTransactionalDataSource(dataSource) (e.g. in ' +
    "TypeOrmModule.forRootAsync's dataSourceFactory), as its docs say.",
  noDataSource: (name: string) =>
    `typeormTransactional(): no data source named "${name}" was registered with typeorm-transactional. Call ` +
    `addTransactionalDataSource(${name === 'default' ? 'dataSource' : `{ name: '${name}', dataSource }`}) for the data ` +
    'source IdempotencyModule uses, or give typeormTransactional({ dataSourceName }) the name it was registered under.',
  otherDataSource: (name: string) =>
    `typeormTransactional(): the data source registered as "${name}" with typeorm-transactional is not the one ` +
    "IdempotencyModule uses, so its transactions could not be the module's. Register the module's data source, or give " +
    'typeormTransactional({ dataSourceName }) the name it was registered under.',
} as const;
