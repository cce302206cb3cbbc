/** What `applyIdempotencyToOpenApi` writes into an OpenAPI document, and what it warns about. */
export const openApiMessages = {
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
} as const;
