/** SQLSTATE of a server process ended by `pg_terminate_backend`. */
export const ADMIN_SHUTDOWN = '57P01';

/** SQLSTATE classes and codes that mean "the database is not there", not "the query is wrong". */
const UNAVAILABLE_SQLSTATES = new Set([
  '57P01',
  '57P02',
  '57P03',
  '53300',
  '53100',
  '08000',
  '08001',
  '08003',
  '08004',
  '08006',
  '08007',
]);
const UNAVAILABLE_ERRNOS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EHOSTUNREACH',
  'EAI_AGAIN',
  'ENETUNREACH',
]);
const UNAVAILABLE_MESSAGES = [
  'Connection terminated',
  'timeout exceeded when trying to connect',
  'Client has encountered a connection error',
  'Cannot use a pool after calling end',
  'Connection is not established',
  'the database system is',
  // Citus (XX000): a worker did not answer the COMMIT of the app's transaction; whether it committed is unknown.
  'could not commit transaction for shard',
];

/**
 * Whether `error` means the database cannot be reached or the connection is
 * gone, rather than a statement it refused: the engine answers 503 for it,
 * and a connection that failed with it is dropped rather than lent again.
 * TypeORM and pg wrap the driver's error, so its `driverError` and `cause`
 * are looked at too, a few levels down.
 */
export function isUnavailableError(error: unknown): boolean {
  for (let current: unknown = error, depth = 0; current && depth < 5; depth++) {
    if (typeof current !== 'object') return false;
    const { code, message, name } = current as { code?: unknown; message?: unknown; name?: unknown };
    // TypeORM releases a transaction's runner when its connection dies; later statements then fail with this.
    if (name === 'QueryRunnerAlreadyReleasedError') return true;
    if (typeof code === 'string' && (UNAVAILABLE_SQLSTATES.has(code) || UNAVAILABLE_ERRNOS.has(code))) return true;
    if (typeof message === 'string' && UNAVAILABLE_MESSAGES.some((m) => message.includes(m))) return true;
    const next = current as { driverError?: unknown; cause?: unknown };
    current = next.driverError ?? next.cause;
  }
  return false;
}
