import { AsyncLocalStorage } from 'node:async_hooks';
import type { EntityManager } from 'typeorm';
import type { Phases } from '../core/phases.js';

/** What an idempotent execution carries through its async calls. */
export interface IdempotencyExecutionContext {
  /** The transaction's manager while the work runs; the plain manager outside one. */
  manager: EntityManager;
  /** Whether this is a transaction opened for an idempotent execution. */
  transactional: boolean;
  /**
   * Set when the route handler's own body starts. A failure before that (a
   * validation pipe, another interceptor) means nothing ran, so the key is
   * released rather than stored.
   */
  handlerStarted: boolean;
  /** The key being executed and its claim's generation, for keys derived from it; absent on routes run without a key. */
  scope?: { tenant: string; key: string; generation?: string };
  /** The phases of a phased execution (`@Idempotent({ phases: true })`). */
  phases?: Phases<EntityManager>;
}

/**
 * One store per process: the handler and every service it calls find the
 * request's transaction here without threading it through their signatures.
 */
export const idempotencyContext = new AsyncLocalStorage<IdempotencyExecutionContext>();
