/** A table the start-up schema check requires, and what creates it. */
export interface TableFix {
  what: 'key' | 'outbox' | 'ledger';
  name: string;
  /** The migration to run, e.g. `CreateIdempotencyKeys1764460800000` or `createIdempotencyKeysMigration('billing.keys')`. */
  migration: string;
  /** The entity for `synchronize: true`, when the table has one. */
  entity?: string;
  /** The package's SQL file that makes the same table, for an app whose own migration tool makes its tables. */
  sqlFile?: string;
}

/** What an app whose own migration tool (prisma migrate, drizzle-kit) makes its tables runs instead of the migration. */
const sqlFileFix = (table: TableFix) =>
  table.sqlFile
    ? ` With a migration tool of your own (prisma migrate, drizzle-kit), add this version's ${table.sqlFile} ` +
      '(shipped with the package; docs/schema.md, "The key table as a SQL file") as a new migration of that tool and run it.'
    : '';

const tableFix = (table: TableFix) =>
  `Run the migration ${table.migration}: add it to your TypeORM \`migrations\` and run them at start-up ` +
  '(`dataSourceFactory: migratingDataSourceFactory()` in TypeOrmModule.forRootAsync runs them safely on several instances)' +
  (table.entity ? `, or, without migrations, add ${table.entity} to \`entities\` with \`synchronize: true\`.` : '.') +
  sqlFileFix(table);

/**
 * The messages of the root entry (the module, its request path, the store and the sweeper), in one place.
 * A subpath's own messages live beside it (src/client/messages.ts, src/outbox/messages.ts, ...), so an
 * entry loads no other entry's text, and the Nest-free client none of this file.
 */
export const messages = {
  config: {
    missingOptions: 'IdempotencyModule needs options: IdempotencyModule.forRoot({ tenant: (ctx) => ... }).',
    tenant:
      'IdempotencyModule: `tenant` must be a function (context) => string that names the tenant of a request. ' +
      "A single-tenant app says so explicitly: `tenant: () => 'default'`.",
    header: (value: unknown) =>
      `IdempotencyModule: \`header\` must be an HTTP header name (token characters only), got ${JSON.stringify(value)}.`,
    maxKeyLength: (value: unknown) =>
      `IdempotencyModule: \`maxKeyLength\` must be an integer from 1 to 8192, got ${String(value)}.`,
    replayHeader: (name: string) =>
      `IdempotencyModule: \`replayHeaders\` may not include "${name}": it is specific to one response and is never replayed.`,
    tableName: (name: string, value: unknown) =>
      `IdempotencyModule: \`${name}\` must be a plain SQL identifier, optionally schema-qualified (e.g. "public.idempotency_keys"), got ${JSON.stringify(value)}.`,
    dataSource:
      'IdempotencyModule: `dataSource` must be the non-empty name of a TypeORM data source, or left out for the default one.',
    poolAndDataSource:
      'IdempotencyModule: give either `pool` (a pg.Pool, or the token it is provided under) or `dataSource` (the name of a ' +
      'TypeORM data source), not both.',
    notAPool:
      'IdempotencyModule: `pool` must be a pg.Pool (new Pool({ connectionString })), or the token of a provider that gives ' +
      'one. Give the module the pool itself, not idempotentPool(pool): that one is for the ORM.',
    migrateNeedsPool:
      "IdempotencyModule: `migrate: true` runs the module's own migration runner on the `pool` option. On TypeORM, add " +
      "the module's migrations to the data source's `migrations` and run them with migratingDataSourceFactory().",
    managerOnPool:
      'TransactionHost.manager is a TypeORM EntityManager, and IdempotencyModule runs on a plain pg pool (the `pool` option). ' +
      "Write through your ORM's integration instead: DrizzleTransactionHost (nest-idempotency-pg/drizzle), or " +
      "idempotentPool(pool) for Prisma's @prisma/adapter-pg (nest-idempotency-pg/pg-pool).",
    nonNegative: (name: string, value: unknown) =>
      `IdempotencyModule: \`${name}\` must be a whole number, 0 or more, got ${String(value)}.`,
    positive: (name: string, value: unknown) =>
      `IdempotencyModule: \`${name}\` must be a positive integer, got ${String(value)}.`,
    duration: (name: string, value: unknown) =>
      `${name} must be a positive whole number of milliseconds or a duration string with its unit such as '30s', '500ms' or '24h', got ${JSON.stringify(value)}.`,
    boolean: (name: string) => `${name} must be true or false.`,
    maxResponseBytes: (where: string, value: unknown) =>
      `${where}: maxResponseBytes must be a whole number of bytes, 1 or more (the default is 1048576, 1 MiB), got ` +
      `${typeof value === 'string' ? JSON.stringify(value) : String(value)}.`,
    claimMode: (where: string, value: unknown) =>
      `${where}: claimMode must be 'separate' or 'request-transaction', got ${JSON.stringify(value)}.`,
    phasesInRequestTransaction: (where: string) =>
      `${where}: phases commit one by one, which a claim inside the request's transaction cannot do. ` +
      "Use claimMode 'separate' (the default) with phases.",
    dutyCycle: (value: unknown) =>
      `IdempotencyModule: \`sweep.dutyCycle\` must be a number greater than 0 and at most 1 (the share of a run spent deleting), got ${JSON.stringify(value)}.`,
    policy: (name: string, value: unknown) => `${name} must be 'store', 'release' or 'keep', got ${JSON.stringify(value)}.`,
    fingerprint: (where: string) => `${where}: \`fingerprint\` must be a function (context) => value.`,
    keyOption: (where: string, value: unknown) =>
      `${where}: \`key\` must name a field of the message payload (or of the mutation's arguments), e.g. 'refundId', or be a ` +
      `function (context) => string that reads the key, got ${JSON.stringify(value) ?? String(value)}.`,
    routes: (problems: string[]) =>
      `IdempotencyModule: ${problems.length === 1 ? 'a route is' : `${problems.length} routes are`} misconfigured:\n` +
      problems.map((p) => `  - ${p}`).join('\n'),
    maxHold: (where: string, maxHoldMs: number, leaseMs: number) =>
      `${where}: maxHold (${maxHoldMs} ms) is shorter than the lease (${leaseMs} ms). The heartbeat renews a lease up to ` +
      'maxHold in all, so it must be at least one lease: raise maxHold, or leave it out for ten leases.',
    unreplayableRoute: (route: string, why: string) =>
      `@Idempotent() route ${route} cannot be replayed: ${why}. Return a value (object, string or Buffer) instead, ` +
      'or use @Res({ passthrough: true }).',
    moduleNotImported:
      '@Idempotent() is used, but IdempotencyModule is not set up in this app. Import ' +
      'IdempotencyModule.forRoot({ tenant: (ctx) => ... }) (or forRootAsync) in your root module, next to TypeOrmModule.forRoot(). ' +
      'With `isGlobal: false`, import it in every module whose controllers, resolvers or message handlers use @Idempotent().',
    scheduleMissing:
      'IdempotencyModule: the sweeper (or the outbox relay) is scheduled but @nestjs/schedule is not set up. Install ' +
      '@nestjs/schedule and import ScheduleModule.forRoot() in your app, or pass `sweep: false` (and no `outbox.relay`) ' +
      'and call IdempotencyService.sweep() / OutboxRelay.relayOnce() yourself.',
    deliveryTimeout: (deliveryMs: number, lockMs: number) =>
      `IdempotencyModule: \`outbox.relay.deliveryTimeout\` (${deliveryMs} ms) must be shorter than \`outbox.relay.lockTimeout\` ` +
      `(${lockMs} ms), so a delivery that times out is settled before its lock lets another relay deliver the message again. ` +
      'Lower deliveryTimeout or raise lockTimeout.',
    tableMissing: (table: TableFix, searched: string) =>
      `IdempotencyModule: the ${table.what} table "${table.name}" does not exist (looked for it in ${searched}). ${tableFix(table)}`,
    tableColumnsMissing: (table: TableFix, missing: readonly string[]) =>
      `IdempotencyModule: the ${table.what} table "${table.name}" lacks the column${missing.length > 1 ? 's' : ''} ` +
      `${missing.join(', ')}, which this version of the module uses. The module's migrations create them: check that ` +
      `${table.migration} and the module's later migrations, if any, are in your \`migrations\` and have run. A table made ` +
      'by hand or by an older version needs the columns added by a migration of your own (types in docs/schema.md, shipped with the package)' +
      (table.entity ? `; without migrations, \`synchronize: true\` with ${table.entity} adds them.` : '.'),
    keyTableFromOlderVersion: (table: TableFix, found: string) =>
      `IdempotencyModule: the key table "${table.name}" has the layout of an earlier version of the module (${found}). ` +
      'This version finds expired keys by expiry_floor, which the completion leaves alone, so that the completion can be a ' +
      `HOT update. ${table.migration} upgrades the table in place: run its statements again (they are idempotent), for ` +
      'instance from a migration of your own whose `up` calls its `up`. docs/schema.md ("Upgrading") shows the migration, ' +
      'and the same steps run online beforehand on a large table' +
      (table.entity ? `; without migrations, \`synchronize: true\` with ${table.entity} upgrades it.` : '.') +
      sqlFileFix(table),
    functionsMissing: (table: TableFix, missing: readonly string[]) =>
      `IdempotencyModule: the function${missing.length > 1 ? 's' : ''} ${missing.join(', ')} of the key table "${table.name}" ` +
      `do${missing.length > 1 ? '' : 'es'} not exist. The claim and the completion call them. ${table.migration} creates them ` +
      'with the table: run it (again, on a table made by an older version: its statements are idempotent), or, without ' +
      'migrations, use `synchronize: true`, with which the module creates them at start-up.' +
      sqlFileFix(table),
    partitionedRequestTransactionIsolation: (tableName: string) =>
      `IdempotencyModule: claimMode 'request-transaction' on the partitioned key table "${tableName}" needs the ` +
      "handler's transaction at READ COMMITTED, and this data source's transactions default to a stricter level " +
      '(its `isolationLevel`, or the default of the database, the role or the connection). There a claim made inside ' +
      "the transaction could miss a key another instance just committed, in another partition. Use claimMode 'separate' " +
      '(it claims at READ COMMITTED whatever the default), the plain key table, or READ COMMITTED.',
    functionsFromOlderVersion: (table: TableFix, stale: readonly string[], needed: string) =>
      `IdempotencyModule: the claim function${stale.length > 1 ? 's' : ''} ${stale.join(', ')} of the key table ` +
      `"${table.name}" ${stale.length > 1 ? 'were' : 'was'} created by an older version of the module, without the key's ` +
      `lock that keeps the two claim modes apart, the handling of REPEATABLE READ and SERIALIZABLE, or the expiry floor ` +
      `the sweeper reads, which this version relies on (it needs "${needed}", marked in their source). ` +
      `${table.migration} replaces ${stale.length > 1 ? 'them' : 'it'} ` +
      'in place: run its statements again (they are idempotent), or, without migrations, use `synchronize: true`, with ' +
      'which the module replaces them at start-up.' +
      sqlFileFix(table),
    partitionLayout: (name: string, expected: string, value: unknown) =>
      `createPartitionedIdempotencyKeysMigration(): \`${name}\` must be ${expected}, got ${JSON.stringify(value) ?? String(value)}.`,
    citusPartitioned:
      'IdempotencyModule: `citus: true` with `partitioned: true` is not supported yet: the partitioned key table has no ' +
      'Citus texts of its functions. On Citus, use the plain key table (leave `partitioned` out).',
    layoutMismatch: (table: TableFix, partitioned: boolean) =>
      partitioned
        ? `IdempotencyModule: \`partitioned: true\` is set, but the key table "${table.name}" is not partitioned. Its ` +
          `partitioned variant is created by ${table.migration}; a plain table with keys in it is moved by hand (docs/scaling.md). ` +
          'Or leave `partitioned` out to use the plain table.'
        : `IdempotencyModule: the key table "${table.name}" is partitioned, so the module must know to retire its partitions: ` +
          'set `partitioned: true` in the module options.',
    partitionedFunctionsStale: (table: TableFix) =>
      `IdempotencyModule: the claim function of the partitioned key table "${table.name}" is not the partitioned table's ` +
      `(a migration of the plain table ran on it, or it was replaced by hand). Run ${table.migration} again: its statements are idempotent.`,
    migrationsNeedOptions:
      'migratingDataSourceFactory(): TypeOrmModule passed no data source options. Use it inside ' +
      'TypeOrmModule.forRootAsync({ useFactory: () => ({ ...options }), dataSourceFactory: migratingDataSourceFactory() }).',
  },
  problems: {
    missingKey: (header: string) => `This endpoint requires an ${header} header.`,
    conflict: 'A request with this idempotency key is still being processed. Retry after the time in Retry-After.',
    mismatch:
      'This idempotency key was already used with a different request (method, path or body). Use a new key for a new request.',
    leaseLost:
      'This attempt took longer than its lease and another attempt with the same key took over; this attempt was rolled back. ' +
      'Retry to get the outcome of the other attempt.',
    unavailable:
      'The idempotency store cannot be reached right now; the request was not processed. Retry later with the same key.',
    outcomeUnknown:
      'The connection to the idempotency store was lost while the request was processed, so whether it took effect is unknown. ' +
      'Retry with the same idempotency key: the retry either replays the result or runs the request once.',
    tenantUnresolved: 'The server could not determine the tenant of this request.',
    unreplayable: 'The server cannot store the response of this endpoint.',
    storeFailed:
      'The idempotency store failed to record the outcome of this request, so it was rolled back. Retry with the same key.',
    commitRefused:
      'The database refused to commit this request (a constraint checked at commit, or a conflict with a concurrent ' +
      'transaction), so none of its changes took effect.',
    unrepresentableBody: (reason: string) =>
      `The request cannot be checked against its idempotency key: ${reason}. Nothing was processed; fix the body and retry.`,
    responseTooLarge: (route: string, maxBytes: number) =>
      `The response of ${route} is larger than its maxResponseBytes (${maxBytes} bytes), so it cannot be stored for retries. ` +
      'Nothing was processed: the request was rolled back and its idempotency key released.',
    responseNotSent:
      'The server did not finish its response to this request in time, so the request was rolled back and nothing of it ' +
      'took effect. Retry with the same idempotency key: until its lease ends, a retry is answered 409 with Retry-After.',
  },
  log: {
    tenantUnresolved: (route: string) =>
      `The tenant resolver returned nothing for ${route}. The request was refused (500) rather than run in a shared scope. ` +
      'Make the resolver return a tenant id for every request, e.g. from the authenticated principal.',
    tenantFailed: (route: string) =>
      `The tenant resolver threw for ${route}. The request was refused (500) rather than run in a shared scope.`,
    tenantUnusable: (route: string, reason: string) =>
      `The tenant the resolver returned for ${route} ${reason}. The request was refused (500) rather than run under a ` +
      'tenant the store cannot hold as it is (converted, it could meet another tenant). Make the resolver return a ' +
      'non-empty string of well-formed Unicode without NUL characters.',
    unavailable: (route: string) => `The idempotency store could not be reached for ${route}; answered 503.`,
    storeFailed: (route: string) =>
      `The idempotency store failed for ${route} after the handler succeeded; the request was rolled back and answered 500.`,
    holdExceeded: (route: string, maxHoldMs: number) =>
      `An attempt of ${route} has held its key for maxHold (${maxHoldMs} ms); its lease is no longer renewed, so a retry ` +
      'can take the key over once the lease runs out, and this attempt will be rolled back if it ever completes.',
    commitRefused: (route: string, code: string) =>
      `The database refused to commit ${route} after the handler returned (SQLSTATE ${code}); none of its writes took ` +
      'effect, and the request was answered 500 and classified by the route onError policy.',
    leaseLost: (route: string, key: string) => `Lease on key ${key} was lost for ${route}; the attempt was rolled back.`,
    responseTooLarge: (route: string, maxBytes: number) =>
      `@Idempotent() route ${route} answered with more than its maxResponseBytes (${maxBytes} bytes). The response was ` +
      'neither held nor stored: the work rolled back, the key was released and the client got a 500 problem. Raise ' +
      '`maxResponseBytes` on the route (@Idempotent({ maxResponseBytes })) or the module, or make the response smaller.',
    responseNotSent: (route: string, waitedMs: number) =>
      `@Idempotent() route ${route} returned, but its response was not ended within its lease (${waitedMs} ms). The work ` +
      'rolled back, the key stays in flight until its lease ends, and the client gets a 500 problem once the response ' +
      'ends. Something after the handler holds the response back (an interceptor, a stream the app writes): end it ' +
      'sooner, or give the route a longer lease.',
  },
  /** What the response capture reports about a response it cannot hold. */
  capture: {
    responseTooLarge: (maxBytes: number) => `The response is larger than maxResponseBytes (${maxBytes} bytes).`,
  },
  /** The sweeper's report of a partitioned key table's upkeep. */
  sweeper: {
    partitions: (p: { made: number; retired: number; retiredKeys: number; postponed: boolean }) =>
      `Retired ${p.retired} partition${p.retired === 1 ? '' : 's'} of the key table (about ${p.retiredKeys} keys); made ` +
      `${p.made} ahead.${p.postponed ? ' A partition change did not get its lock in time and is put off to the next run.' : ''}`,
  },
  /** Idempotent message handlers (`@Idempotent()` on `@EventPattern` / `@MessagePattern`); no message names a key or a payload. */
  consumer: {
    deadLettered: (route: string, reason: string) => `A message for ${route} was dead-lettered: ${reason}.`,
    missingKey:
      'it carries no idempotency key (give it a RabbitMQ messageId, a Nats-Msg-Id header or an idempotencyKey field, ' +
      'or set `key` in @Idempotent() to read it elsewhere)',
    invalidKey: (maxLength: number) => `its idempotency key is not 1 to ${maxLength} visible ASCII characters`,
    tenantUnresolved:
      'the tenant resolver returned nothing usable (no tenant, or not a non-empty string of well-formed Unicode without ' +
      "NUL) or threw for it; it was not run in a shared scope. Make the resolver handle messages (ctx.getType() === 'rpc')",
    unrepresentable: (reason: string) => `it cannot be fingerprinted: ${reason}`,
    mismatch: 'its idempotency key was already used by a different message (another pattern or payload)',
    rejected: 'a pipe rejected its payload before the handler ran; it would be rejected again',
    failed: (attempts: number) => `its handler failed on ${attempts} deliveries (maxDeliveries)`,
    poisoned: (attempts: number) =>
      `it was already attempted ${attempts} times (maxDeliveries) without a verdict or with failures, so its handler was not run again`,
    failedWithoutKey: 'its handler failed, and without a key nothing counts its attempts (required: false)',
    unexpected: (route: string) => `Processing a message for ${route} failed unexpectedly; the message is dead-lettered.`,
    handlerFailed: (route: string, attempt: number, max: number, delaySeconds: number) =>
      `The handler of ${route} failed (delivery ${attempt} of at most ${max}); the message is redelivered in ${delaySeconds} s.`,
    requeued: (route: string, delaySeconds: number, why: string) =>
      `A message for ${route} is requeued in ${delaySeconds} s: ${why}.`,
    inFlight: 'another delivery of the same key holds it',
    leaseLost: 'this delivery outran its lease and was rolled back; another delivery holds the key',
    unavailable: 'the idempotency store cannot be reached',
    settleFailed: (route: string, action: string, reason: string) =>
      `Could not ${action} a message for ${route}: ${reason}. The broker redelivers it when its channel or ack timer ` +
      'ends. With RabbitMQ, consume with `noAck: false`: the module acknowledges each message itself, after its commit.',
  },
  /** The app's own transaction manager (the module's `transactionManager`). */
  transactionManager: {
    invalid:
      'IdempotencyModule: `transactionManager` must be what clsTransactional() (nest-idempotency-pg/cls-transactional), ' +
      'typeormTransactional() (nest-idempotency-pg/typeorm-transactional) or clsTransactionalDrizzle() ' +
      '(nest-idempotency-pg/drizzle) returns, or an object with setUp() and join().',
    notSetUp: (name: string) =>
      `${name} was used before IdempotencyModule set it up at start-up: give it to IdempotencyModule.forRoot({ ` +
      'transactionManager }) (or forRootAsync), and start the app with app.init() or app.listen().',
  },
  /** Idempotent GraphQL mutations (`@Idempotent()` on a resolver). */
  graphql: {
    noRequest:
      'The GraphQL context carries no HTTP request, so the idempotency key header cannot be read. Put the request in the ' +
      'context (Apollo on Express: `context: ({ req }) => ({ req })`; on Fastify: `context: (req) => ({ req })`), or ' +
      'pass the key as an argument and name it with `key` in @Idempotent().',
  },
} as const;
