/**
 * `nest-idempotency-pg/graphql`: what a GraphQL app reads off the module's
 * errors. `@Idempotent()` on a resolver needs nothing from here: the root
 * entry's decorator serves mutations too, and loads no GraphQL package.
 */
export { IdempotencyGraphQLError, type IdempotencyErrorExtensions } from './graphql-problem.js';
