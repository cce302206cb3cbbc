// The subpaths (the integrations', the outbox's and the ledger's), in an app that has none of the optional peers: their types
// compile (lib check on), they load, and using one whose peer is missing says what to install.
import { IdempotencyBoardModule, type BoardScope } from 'nest-idempotency-pg/board';
import { IdempotencyGraphQLError, type IdempotencyErrorExtensions } from 'nest-idempotency-pg/graphql';
import { HEALTH_PROBE_TENANT, IdempotencyHealthIndicator, IdempotencyHealthModule } from 'nest-idempotency-pg/health';
import { CreateEffectLedger1764806400000, EffectLedger, type EffectKeyOptions } from 'nest-idempotency-pg/ledger';
import { applyIdempotencyToOpenApi, IdempotencyOpenApiModule, type OpenApiDocumentLike } from 'nest-idempotency-pg/openapi';
import { createDownstreamFetch, IdempotentHttpModule, type DownstreamFetch } from 'nest-idempotency-pg/outbound';
import { CreateOutboxMessages1764547200000, Outbox, OutboxRelay, type OutboxMessage } from 'nest-idempotency-pg/outbox';
import { idempotentPool } from 'nest-idempotency-pg/pg-pool';
import { IdempotencyStore, type SweepOptions } from 'nest-idempotency-pg/store';
import pg from 'pg';

const extensions: IdempotencyErrorExtensions = { code: 'CONFLICT', type: 'urn:x', status: 409 };
const document: OpenApiDocumentLike = { paths: {} };
const fetchWithKeys: DownstreamFetch = createDownstreamFetch();
const scope: BoardScope = { allTenants: true };
const effect: EffectKeyOptions = { tenant: 'package-test' };
const message: Pick<OutboxMessage, 'topic'> = { topic: 'receipt' };
const sweep: SweepOptions = { batchSize: 100, maxDurationMs: 1000 };

// What PrismaPg checks before it keeps a pool (no connection is opened).
const appPool = new pg.Pool({ max: 1 });
const pgPool = idempotentPool(appPool) instanceof pg.Pool;
await appPool.end();

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
        Outbox,
        OutboxRelay,
        EffectLedger,
        IdempotencyStore,
      ].map((exported) => exported.name),
      migrations: [CreateOutboxMessages1764547200000, CreateEffectLedger1764806400000].map((m) => typeof m),
      board: IdempotencyBoardModule.forRoot({ path: 'board', unguarded: true, scope: () => scope }).controllers?.length,
      probeTenant: HEALTH_PROBE_TENANT,
      extensions: extensions.code,
      effect: effect.tenant,
      topic: message.topic,
      sweep: sweep.batchSize,
      openapi: applyIdempotencyToOpenApi(document) === document,
      fetch: typeof fetchWithKeys,
      pgPool,
      axios,
    }),
);
