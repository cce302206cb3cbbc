/** The client's messages; no message names a key, a body or a header value. Nothing here imports the Nest side. */
export const clientMessages = {
  option: (name: string, expected: string, value: unknown) =>
    `IdempotentClient: \`${name}\` must be ${expected}, got ${JSON.stringify(value) ?? String(value)}.`,
  retryStatus: (status: unknown) =>
    `IdempotentClient: \`retryStatuses\` may not include ${JSON.stringify(status)}. Only 408, 409, 425, 429 and 5xx ` +
    "statuses can be retried: any other 4xx (a 400, a 422) is the server's definite answer about the request itself, " +
    'which the same request with the same key can only get again. Fix the request instead.',
  budgetRatio: (value: unknown) =>
    `RetryBudget: \`ratio\` must be a number from 0 to 1 (the share of requests that may be retried), got ${JSON.stringify(value)}.`,
  budgetMinRetries: (value: unknown) =>
    `RetryBudget: \`minRetries\` must be a whole number of retries allowed per window (0 or more), got ${JSON.stringify(value)}.`,
  budgetWindow: (value: unknown) =>
    `RetryBudget: \`window\` must be a whole number of milliseconds, at least 10, got ${JSON.stringify(value)}.`,
  invalidKey:
    'The idempotency key must be one or more visible ASCII characters (0x21-0x7E). Leave `key` out for a random one, ' +
    'or build one from business identity with businessKey(...).',
  keyInHeaders: (header: string) =>
    `Pass the idempotency key as \`key\`, not as a ${header} header: the client sends it, the same, on every attempt.`,
  bodyAndJson: 'Give a request either `json` or `body`, not both.',
  body: 'A request body must be a string, a Uint8Array or an ArrayBuffer: every attempt sends the same bytes, which a stream cannot.',
  relativeUrl:
    'The request URL is relative but the client has no `baseUrl`: give the client a baseUrl or the request an absolute URL.',
  outcomeUnknown: (attempts: number, reason: 'attempts' | 'deadline' | 'budget' | 'aborted') =>
    `No answer after ${attempts} attempt${attempts === 1 ? '' : 's'} (${
      {
        attempts: 'no attempts left',
        deadline: 'the deadline passed',
        budget: "the client's retry budget is spent",
        aborted: 'aborted by the caller',
      }[reason]
    }): the request may or may not have taken effect. Send it again later with the same key (error.key) to learn its outcome.`,
  attemptTimedOut: (ms: number) => `The attempt got no complete answer within ${ms} ms.`,
} as const;
