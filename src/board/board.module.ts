import { Inject, Logger, Module, type DynamicModule, type OnModuleInit } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import type { SourceDataSource } from '../store/connection.js';
import { IdempotencyStore } from '../core/idempotency-store.js';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { boardMessages } from './messages.js';
import { IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { PostgresIdempotencyStore } from '../store/postgres/postgres-idempotency.store.js';
import { BoardOutcomes } from './board-outcomes.js';
import { BoardProblemFilter } from './board-problems.js';
import { boardController } from './board.controller.js';
import { BoardGuard } from './board.guard.js';
import { BOARD_OPTIONS, BoardKeyStore, type IdempotencyBoardOptions, type ResolvedBoardOptions } from './board.options.js';
import { BoardQueries } from './board.queries.js';
import { BoardRouteLabels } from './route-labels.js';

const PATH = /^[A-Za-z0-9._~-]+(\/[A-Za-z0-9._~-]+)*$/;

function resolveBoardOptions(options: IdempotencyBoardOptions): ResolvedBoardOptions {
  const path = typeof options.path === 'string' ? options.path.replace(/^\/+|\/+$/g, '') : '';
  if (!PATH.test(path)) throw new IdempotencyConfigurationError(boardMessages.badPath);
  if (!options.guard && options.unguarded !== true) throw new IdempotencyConfigurationError(boardMessages.noGuard);
  return {
    path,
    guard: options.guard,
    unguarded: !options.guard && options.unguarded === true,
    scope: options.scope,
    showBodies: options.showBodies === true,
  };
}

/**
 * An operator's board for the idempotency module: keys by state, stuck keys
 * (and releasing them), a key lookup, the outbox's dead letters (and
 * redriving them), and the last hour's outcomes, as one page at `path` and
 * the JSON it reads. Import it beside `IdempotencyModule` (global by
 * default), behind a guard of the app's:
 *
 * ```ts
 * IdempotencyBoardModule.forRoot({ path: 'board', guard: AdminGuard })
 * ```
 */
@Module({})
export class IdempotencyBoardModule implements OnModuleInit {
  private static readonly logger = new Logger('IdempotencyBoard');

  static forRoot(options: IdempotencyBoardOptions): DynamicModule {
    const resolved = resolveBoardOptions(options);
    return {
      module: IdempotencyBoardModule,
      // DiscoveryModule: the pass over the app's routes that names them as requests do (BoardRouteLabels).
      imports: [DiscoveryModule, ...(options.imports ?? [])],
      controllers: [boardController(resolved.path)],
      providers: [
        { provide: BOARD_OPTIONS, useValue: resolved },
        {
          provide: BoardKeyStore,
          useFactory: (store: IdempotencyStore) => {
            if (!(store instanceof PostgresIdempotencyStore))
              throw new IdempotencyConfigurationError(boardMessages.noPostgresStore);
            return store;
          },
          inject: [IdempotencyStore],
        },
        {
          provide: BoardQueries,
          useFactory: (
            store: PostgresIdempotencyStore,
            dataSource: SourceDataSource,
            moduleOptions: ResolvedIdempotencyOptions,
          ) =>
            new BoardQueries(
              dataSource,
              store.tableName,
              moduleOptions.outbox.configured ? moduleOptions.outbox.tableName : undefined,
            ),
          inject: [BoardKeyStore, IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS],
        },
        BoardOutcomes,
        BoardRouteLabels,
        BoardGuard,
        BoardProblemFilter,
      ],
    };
  }

  constructor(@Inject(BOARD_OPTIONS) private readonly options: ResolvedBoardOptions) {}

  onModuleInit(): void {
    if (this.options.unguarded) IdempotencyBoardModule.logger.warn(boardMessages.unguarded(this.options.path));
  }
}
