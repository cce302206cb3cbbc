/** Outbound calls from handlers with derived keys (`createDownstreamFetch`, `attachDownstreamKeys`, `IdempotentHttpModule`). */
export const outboundMessages = {
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
} as const;
