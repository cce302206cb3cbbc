/** A key as it may appear in a log line: enough to correlate, not enough to replay someone else's request. */
export function redactKey(key: string): string {
  return key.length <= 4 ? '****' : `${key.slice(0, 4)}…(${key.length})`;
}
