/** `IdempotencyHealthIndicator`: what its result says; never a key, a tenant or a body. */
export const healthMessages = {
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
} as const;
