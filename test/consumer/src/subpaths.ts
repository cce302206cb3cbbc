// The integrations' subpaths, in an app that has none of their optional peers: their types
// compile (lib check on), they load, and using one whose peer is missing says what to install.
import { IdempotencyBoardModule, type BoardScope } from 'nest-idempotency-pg/board';
import { IdempotencyGraphQLError, type IdempotencyErrorExtensions } from 'nest-idempotency-pg/graphql';
import { HEALTH_PROBE_TENANT, IdempotencyHealthIndicator, IdempotencyHealthModule } from 'nest-idempotency-pg/health';
import { applyIdempotencyToOpenApi, IdempotencyOpenApiModule, type OpenApiDocumentLike } from 'nest-idempotency-pg/openapi';
import { createDownstreamFetch, IdempotentHttpModule, type DownstreamFetch } from 'nest-idempotency-pg/outbound';

const extensions: IdempotencyErrorExtensions = { code: 'CONFLICT', type: 'urn:x', status: 409 };
const document: OpenApiDocumentLike = { paths: {} };
const fetchWithKeys: DownstreamFetch = createDownstreamFetch();
const scope: BoardScope = { allTenants: true };

let axios: string;
try {
  await IdempotentHttpModule.register();
  axios = 'registered';
} catch (error) {
  axios = `${(error as Error).name}: ${(error as Error).message}`;
}

// The test script reads this line (applyIdempotencyToOpenApi logs a warning before it: no app marked its routes).
console.log(
  'SUBPATHS ' +
    JSON.stringify({
      loaded: [
        IdempotencyGraphQLError,
        IdempotencyHealthIndicator,
        IdempotencyHealthModule,
        IdempotencyOpenApiModule,
        IdempotencyBoardModule,
      ].map((exported) => exported.name),
      board: IdempotencyBoardModule.forRoot({ path: 'board', unguarded: true, scope: () => scope }).controllers?.length,
      probeTenant: HEALTH_PROBE_TENANT,
      extensions: extensions.code,
      openapi: applyIdempotencyToOpenApi(document) === document,
      fetch: typeof fetchWithKeys,
      axios,
    }),
);
