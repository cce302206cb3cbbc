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
    positive: (name: string, value: unknown) =>
      `IdempotencyModule: \`${name}\` must be a positive integer, got ${String(value)}.`,
    duration: (name: string, value: unknown) =>
      `${name} must be a positive whole number of milliseconds or a duration string such as '30s' or '24h', got ${JSON.stringify(value)}.`,
    leaseVsTtl: (where: string, lease: number, ttl: number) =>
      `${where}: the lease (${lease} ms) must be shorter than the TTL (${ttl} ms), or a key could expire while its request still runs.`,
    boolean: (name: string) => `${name} must be true or false.`,
    dutyCycle: (value: unknown) =>
      `IdempotencyModule: \`sweep.dutyCycle\` must be a number greater than 0 and at most 1 (the share of a run spent deleting), got ${JSON.stringify(value)}.`,
    policy: (name: string, value: unknown) => `${name} must be 'store', 'release' or 'keep', got ${JSON.stringify(value)}.`,
    fingerprint: (where: string) => `${where}: \`fingerprint\` must be a function (context) => value.`,
    unreplayableRoute: (route: string, why: string) =>
      `@Idempotent() route ${route} cannot be replayed: ${why}. Return a value (object, string or Buffer) instead, ` +
      'or use @Res({ passthrough: true }).',
    scheduleMissing:
      'IdempotencyModule: the sweeper (or the outbox relay) is scheduled but @nestjs/schedule is not set up. Install ' +
      '@nestjs/schedule and import ScheduleModule.forRoot() in your app, or pass `sweep: false` (and no `outbox.relay`) ' +
      'and call IdempotencyService.sweep() / OutboxRelay.relayOnce() yourself.',
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
  },
  log: {
    tenantUnresolved: (route: string) =>
      `The tenant resolver returned nothing for ${route}. The request was refused (500) rather than run in a shared scope. ` +
      'Make the resolver return a tenant id for every request, e.g. from the authenticated principal.',
    tenantFailed: (route: string) =>
      `The tenant resolver threw for ${route}. The request was refused (500) rather than run in a shared scope.`,
    unavailable: (route: string) => `The idempotency store could not be reached for ${route}; answered 503.`,
    leaseLost: (route: string, key: string) => `Lease on key ${key} was lost for ${route}; the attempt was rolled back.`,
  },
} as const;
