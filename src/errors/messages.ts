/** A table the start-up schema check requires, and what creates it. */
export interface TableFix {
  what: 'key' | 'outbox' | 'ledger';
  name: string;
  /** The migration to run, e.g. `CreateIdempotencyKeys1764460800000` or `createIdempotencyKeysMigration('billing.keys')`. */
  migration: string;
  /** The entity for `synchronize: true`, when the table has one. */
  entity?: string;
}

const tableFix = (table: TableFix) =>
  `Run the migration ${table.migration}: add it to your TypeORM \`migrations\` and run them at start-up ` +
  '(`dataSourceFactory: migratingDataSourceFactory()` in TypeOrmModule.forRootAsync runs them safely on several instances)' +
  (table.entity ? `, or, without migrations, add ${table.entity} to \`entities\` with \`synchronize: true\`.` : '.');

/** Every message the module produces, in one place. */
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
    functionsMissing: (table: TableFix, missing: readonly string[]) =>
      `IdempotencyModule: the function${missing.length > 1 ? 's' : ''} ${missing.join(', ')} of the key table "${table.name}" ` +
      `do${missing.length > 1 ? '' : 'es'} not exist. The claim and the completion call them. ${table.migration} creates them ` +
      'with the table: run it (again, on a table made by an older version: its statements are idempotent), or, without ' +
      'migrations, use `synchronize: true`, with which the module creates them at start-up.',
    partitionedRequestTransactionIsolation: (tableName: string) =>
      `IdempotencyModule: claimMode 'request-transaction' on the partitioned key table "${tableName}" needs the ` +
      "handler's transaction at READ COMMITTED, and this data source's transactions default to a stricter level " +
      '(its `isolationLevel`, or the default of the database, the role or the connection). There a claim made inside ' +
      "the transaction could miss a key another instance just committed, in another partition. Use claimMode 'separate' " +
      '(it claims at READ COMMITTED whatever the default), the plain key table, or READ COMMITTED.',
    functionsFromOlderVersion: (table: TableFix, stale: readonly string[]) =>
      `IdempotencyModule: the claim function${stale.length > 1 ? 's' : ''} ${stale.join(', ')} of the key table ` +
      `"${table.name}" ${stale.length > 1 ? 'were' : 'was'} created by an older version of the module, without the key's ` +
      `lock that keeps the two claim modes apart and the handling of REPEATABLE READ and SERIALIZABLE this version relies ` +
      `on. ${table.migration} replaces ${stale.length > 1 ? 'them' : 'it'} in place: run its statements again (they are ` +
      'idempotent), or, without migrations, use `synchronize: true`, with which the module replaces them at start-up.',
    partitionLayout: (name: string, expected: string, value: unknown) =>
      `createPartitionedIdempotencyKeysMigration(): \`${name}\` must be ${expected}, got ${JSON.stringify(value) ?? String(value)}.`,
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
  },
  /** What the response capture reports about a response it cannot hold. */
  capture: {
    responseTooLarge: (maxBytes: number) => `The response is larger than maxResponseBytes (${maxBytes} bytes).`,
  },
  /** The outbox relay's errors and logs; they name a message by id and topic, never by payload. */
  outbox: {
    duplicateHandler: (topic: string) => `OutboxRelay: a handler for "${topic}" is already registered.`,
    noHandler: (topic: string) => `No outbox handler is registered for topic "${topic}".`,
    deliveryTimedOut: (ms: number) =>
      `The handler did not settle within deliveryTimeout (${ms} ms); its AbortSignal was aborted and the delivery counted as failed.`,
    relayed: (r: { claimed: number; delivered: number; retried: number; deadLettered: number; unsettled: number }) =>
      `Relayed ${r.claimed} outbox messages: ${r.delivered} delivered, ${r.retried} to retry, ${r.deadLettered} dead-lettered` +
      (r.unsettled > 0 ? `, ${r.unsettled} delivered but not yet marked delivered.` : '.'),
    deadLettered: (id: string, topic: string, attempts: number, reason: string) =>
      `Outbox message ${id} (${topic}) dead-lettered after ${attempts} attempts: ${reason}`,
    unsettled: (id: string, topic: string, reason: string) =>
      `Outbox message ${id} (${topic}) was delivered, but marking it delivered failed: ${reason}. It does not count as a ` +
      'failed attempt: this relay marks it on a later round, or, if its lock expires first, another relay delivers it again.',
    attemptsExhausted: (attempts: number, maxAttempts: number) =>
      `Its delivery was attempted ${attempts} times (maxAttempts ${maxAttempts}), so it is not delivered again: the last ` +
      'attempt ended without a result (its relay stopped, or its lock expired mid-delivery), or maxAttempts was lowered since.',
    exhaustedUnrecorded: (id: string, topic: string, reason: string) =>
      `Outbox message ${id} (${topic}) has no attempt left, but dead-lettering it failed: ${reason}. It is not delivered; ` +
      'the relay that claims it after its lock expires dead-letters it.',
    lockNotRenewed: (id: string, topic: string, reason: string) =>
      `Outbox message ${id} (${topic}) was not delivered: its lock could not be renewed for the delivery (${reason}). It is ` +
      'tried again once its lock expires; this counted as one of its attempts.',
    renewalTooSlow: 'the renewal took longer than lockTimeout minus deliveryTimeout',
    failureUnrecorded: (id: string, topic: string, reason: string) =>
      `Outbox message ${id} (${topic}) failed, and recording the failure failed too: ${reason}. It is retried once its lock expires.`,
    roundFailed: (reason: string) => `Relay round failed: ${reason}`,
  },
  /** What `applyIdempotencyToOpenApi` writes into an OpenAPI document. */
  openapi: {
    keyHeader: (required: boolean, maxKeyLength: number, ttl: string) =>
      'Makes the request safe to retry: a retry with the same key and the same request gets the first response again ' +
      `(with Idempotent-Replayed: true) for ${ttl}; the same key with another request answers 422. ` +
      `${required ? 'Required.' : 'Optional: without it the request runs without idempotency.'} 1 to ${maxKeyLength} visible ` +
      'ASCII characters (0x21-0x7E), case-sensitive; a bare token may not contain a comma, or send an RFC 8941 string ("...").',
    replayedHeader: 'Present, with the value true, when this is the stored response of an earlier request with the same key.',
    retryAfter: 'Seconds to wait before retrying with the same key.',
    badRequest: 'The idempotency key is missing, malformed, repeated or too long, or the body cannot be fingerprinted.',
    conflict: 'A request with this key is still being processed, or this attempt lost its lease; retry after Retry-After.',
    mismatch: 'The key was already used with a different request (method, route, parameters, query or body).',
    unavailable: 'The idempotency store cannot be reached; the request was not processed. Retry after Retry-After.',
    problem: 'An RFC 9457 problem: `type` is a stable URI per case.',
    swaggerUnloadable: (reason: string) =>
      `@nestjs/swagger is installed but could not be loaded, so idempotent routes are not marked for OpenAPI: ${reason}. ` +
      'Check that its version matches your NestJS major version.',
    marksModuleMissing:
      'applyIdempotencyToOpenApi found no idempotent operation, and no IdempotencyOpenApiModule marked the routes of an app ' +
      "in this process: add `imports: [IdempotencyOpenApiModule]` (from 'nest-idempotency-pg/openapi') beside " +
      'IdempotencyModule.forRoot(...), then generate the document.',
  },
  /** `IdempotencyHealthIndicator`: what its result says; never a key, a tenant or a body. */
  sweeper: {
    partitions: (p: { made: number; retired: number; retiredKeys: number; postponed: boolean }) =>
      `Retired ${p.retired} partition${p.retired === 1 ? '' : 's'} of the key table (about ${p.retiredKeys} keys); made ` +
      `${p.made} ahead.${p.postponed ? ' A partition change did not get its lock in time and is put off to the next run.' : ''}`,
  },
  health: {
    terminusMissing:
      'IdempotencyHealthIndicator.isHealthy() needs @nestjs/terminus: npm i @nestjs/terminus and import TerminusModule ' +
      'where your health controller lives, or call report() for a result without Terminus.',
    timedOut: (ms: number) => `No answer within ${ms} ms.`,
    sweeperOverdue: (ms: number) => `The sweeper has not finished a run for ${Math.round(ms / 1000)} s.`,
    sweeperFailed: (reason: string) => `The last sweep failed: ${reason}`,
    backlog: (limit: number) =>
      `At least ${limit} expired keys wait to be swept: the sweeper is off, failing or falling behind (expired keys still count as absent).`,
    partitionsAhead: (aheadMs: number, intervalMs: number) =>
      aheadMs <= 0
        ? 'No partition of the key table covers now: new keys go to its default partition. Partition upkeep (pg_partman ' +
          "or the module's sweeper run) is not running or failing."
        : `The newest partition of the key table ends in ${Math.round(aheadMs / 60_000)} min, less than one partition ` +
          `(${Math.round(intervalMs / 60_000)} min) ahead: partition upkeep (pg_partman or the module's sweeper run) is falling behind.`,
    defaultPartitionRows: (count: number, capped: boolean) =>
      `${count}${capped ? ' or more' : ''} key${count === 1 && !capped ? '' : 's'} sit in the default partition of the key ` +
      'table: no partition covered their time when they were claimed (upkeep fell behind). They are correct there, but ' +
      'retired row by row; keep partitions ahead.',
    partitionsOverdue: (count: number) =>
      `${count} partitions of the key table hold nothing live but are still attached: retirement is off, failing, or cannot ` +
      'get its lock (a long transaction on the key table).',
    deadLetters: (count: number, capped: boolean) =>
      `${count}${capped ? ' or more' : ''} outbox message${count === 1 && !capped ? ' is' : 's are'} dead-lettered: ` +
      'fix the cause, then redrive them (Outbox.store.redrive()).',
  },
  /** Outbound calls from handlers with derived keys (`createDownstreamFetch`, `attachDownstreamKeys`, `IdempotentHttpModule`). */
  outbound: {
    header: (value: unknown) =>
      `Downstream keys: \`header\` must be an HTTP header name (token characters only), got ${JSON.stringify(value)}.`,
    methods: (value: unknown) =>
      `Downstream keys: \`methods\` must be a list of HTTP method names, e.g. ['POST', 'PATCH'], got ${JSON.stringify(value)}.`,
    purpose: 'Downstream keys: a call\'s `idempotencyPurpose` must be a non-empty string, e.g. "charge".',
    repeatedCall: (method: string, path: string) =>
      `A second ${method} ${path} in one idempotent execution, without an \`idempotencyPurpose\`: both calls would carry the ` +
      'same derived key, so the provider would answer the second with the outcome of the first. Give each call a purpose of ' +
      "its own (e.g. 'charge' and 'fee'); give the same purpose again only when the call is a retry of the same operation.",
    axiosMissing:
      'IdempotentHttpModule needs @nestjs/axios and axios: npm i @nestjs/axios axios. Or, without them, use ' +
      'createDownstreamFetch() for fetch, or attachDownstreamKeys(instance) on an axios instance of your own.',
  },
  /** The effect ledger (`EffectLedger`). */
  ledger: {
    noTransaction:
      'EffectLedger.once() needs a transaction: call it inside an @Idempotent() handler or IdempotencyService.execute() ' +
      '(it joins their transaction), or pass the EntityManager of a transaction of your own. A ledger row that commits ' +
      'apart from its effect proves nothing.',
    tenant:
      'EffectLedger: no tenant. Inside an idempotent execution the ledger uses its tenant; elsewhere pass { tenant }. ' +
      'There is no shared fallback scope.',
    key: (value: unknown) =>
      `EffectLedger: the business key must be a non-empty string such as 'order:1042:capture' (businessKey() builds one), got ${
        JSON.stringify(value) ?? String(value)
      }.`,
    scope: (value: unknown) =>
      `EffectLedger: \`scope\` must be a non-empty string, got ${JSON.stringify(value) ?? String(value)}.`,
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
  /** `JetStreamServer` (nest-idempotency-pg/jetstream); no message names a key or a payload. */
  jetstream: {
    maxMessages: (value: unknown) =>
      `JetStreamServer: \`maxMessages\` must be a whole number of at least 1 (the handlers run at once), got ${
        JSON.stringify(value) ?? String(value)
      }. Keep it at or below the data source's pool size: each running handler holds a connection for its transaction.`,
    pullFailed: (stream: string, consumer: string, reason: string, retryMs: number) =>
      `JetStreamServer: pulling messages from ${stream}/${consumer} failed (${reason}); trying again in ${retryMs} ms.`,
  },
  /** The app's own transaction manager (the module's `transactionManager`). */
  transactionManager: {
    invalid:
      'IdempotencyModule: `transactionManager` must be what clsTransactional() (nest-idempotency-pg/cls-transactional) or ' +
      'typeormTransactional() (nest-idempotency-pg/typeorm-transactional) returns, or an object with setUp() and join().',
    notSetUp: (name: string) =>
      `${name} was used before IdempotencyModule set it up at start-up: give it to IdempotencyModule.forRoot({ ` +
      'transactionManager }) (or forRootAsync), and start the app with app.init() or app.listen().',
    clsMissing:
      'clsTransactional() needs nestjs-cls and @nestjs-cls/transactional with its TypeORM adapter: ' +
      'npm i nestjs-cls @nestjs-cls/transactional @nestjs-cls/transactional-adapter-typeorm.',
    clsNoHost: (connectionName: string | undefined) =>
      `clsTransactional(): no TransactionHost${connectionName ? ` for connectionName "${connectionName}"` : ''} is registered. ` +
      'Register the plugin as its docs say: ClsModule.forRoot({ global: true, plugins: [new ClsPluginTransactional({ ' +
      `imports: [TypeOrmModule], ${connectionName ? `connectionName: '${connectionName}', ` : ''}adapter: new ` +
      'TransactionalAdapterTypeOrm({ dataSourceToken: getDataSourceToken() }) })] }), and give clsTransactional() the same ' +
      'connectionName.',
    clsUnsupported:
      'clsTransactional(): this version of @nestjs-cls/transactional has no TransactionHost#setTxInstance, which the module ' +
      'uses to make its transaction the active one. Use @nestjs-cls/transactional 3.x (3.3 is tested).',
    clsOtherDataSource: (connectionName: string | undefined) =>
      `clsTransactional(): the TransactionHost${connectionName ? ` "${connectionName}"` : ''} does not manage the data source ` +
      "IdempotencyModule uses, so its transactions could not be the module's. Give TransactionalAdapterTypeOrm the " +
      "dataSourceToken of the module's data source (getDataSourceToken(name) for IdempotencyModule's `dataSource`), or " +
      'name the right connectionName.',
    typeormTransactionalMissing: 'typeormTransactional() needs typeorm-transactional: npm i typeorm-transactional.',
    typeormTransactionalNotInitialized:
      'typeormTransactional(): typeorm-transactional is not initialised. Call initializeTransactionalContext() before ' +
      'NestFactory.create(), and register the data source with addTransactionalDataSource(dataSource) (e.g. in ' +
      "TypeOrmModule.forRootAsync's dataSourceFactory), as its docs say.",
    typeormTransactionalNoDataSource: (name: string) =>
      `typeormTransactional(): no data source named "${name}" was registered with typeorm-transactional. Call ` +
      `addTransactionalDataSource(${name === 'default' ? 'dataSource' : `{ name: '${name}', dataSource }`}) for the data ` +
      'source IdempotencyModule uses, or give typeormTransactional({ dataSourceName }) the name it was registered under.',
    typeormTransactionalOtherDataSource: (name: string) =>
      `typeormTransactional(): the data source registered as "${name}" with typeorm-transactional is not the one ` +
      "IdempotencyModule uses, so its transactions could not be the module's. Register the module's data source, or give " +
      'typeormTransactional({ dataSourceName }) the name it was registered under.',
  },
  /** Idempotent GraphQL mutations (`@Idempotent()` on a resolver). */
  graphql: {
    noRequest:
      'The GraphQL context carries no HTTP request, so the idempotency key header cannot be read. Put the request in the ' +
      'context (Apollo on Express: `context: ({ req }) => ({ req })`; on Fastify: `context: (req) => ({ req })`), or ' +
      'pass the key as an argument and name it with `key` in @Idempotent().',
  },
  /** The operator board (`nest-idempotency-pg/board`); no message names a key, a tenant or a body. */
  board: {
    noGuard:
      'IdempotencyBoardModule.forRoot() needs a guard: the board shows keys and outcomes and can release keys and ' +
      'redrive messages. Pass { guard: YourAdminGuard } (a class or an instance), or { unguarded: true } for a local tool.',
    unguarded: (path: string) =>
      `The idempotency board at /${path} runs without a guard (unguarded: true): anyone who reaches it can see keys and ` +
      'release them.',
    badPath: 'IdempotencyBoardModule.forRoot({ path }): give the path the board is mounted at, e.g. "board".',
    noPostgresStore:
      'The idempotency board reads the key table of PostgresIdempotencyStore; with a store of your own it cannot run. ' +
      'Leave it out of the imports.',
    badScope:
      "The board's scope function gave neither { tenant } nor { allTenants: true } for this operator, so nothing is shown.",
    csrf:
      "This action needs the board's anti-forgery token: reload the board page and try again (requests from other " +
      'sites are refused).',
    badRequest: (what: string) => `The request's ${what} is missing or malformed.`,
    notFound: 'No such key for this tenant, or it is not yours to see.',
    released: 'That attempt no longer holds the key: it finished, was taken over, or was released already. Refresh.',
    timedOut: (ms: number) =>
      `The key table did not answer within ${ms} ms (counting a very large table is a full scan). Try again later, or ` +
      'look up single keys.',
  },
} as const;
