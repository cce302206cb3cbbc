/** The outbox relay's errors and logs; they name a message by id and topic, never by payload. */
export const outboxMessages = {
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
  tenantRequiredOnCitus:
    'Outbox.enqueue: a message needs a tenant with `citus: true`: the outbox is distributed by tenant_id, so a message ' +
    "without one has no shard (and would not commit with the business writes on the tenant's worker). Pass `tenant`, " +
    'or enqueue inside an idempotent request or execution, whose tenant is used.',
} as const;
