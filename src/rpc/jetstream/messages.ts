/** `JetStreamServer`; no message names a key or a payload. */
export const jetStreamMessages = {
  maxMessages: (value: unknown) =>
    `JetStreamServer: \`maxMessages\` must be a whole number of at least 1 (the handlers run at once), got ${
      JSON.stringify(value) ?? String(value)
    }. Keep it at or below the data source's pool size: each running handler holds a connection for its transaction.`,
  pullFailed: (stream: string, consumer: string, reason: string, retryMs: number) =>
    `JetStreamServer: pulling messages from ${stream}/${consumer} failed (${reason}); trying again in ${retryMs} ms.`,
} as const;
