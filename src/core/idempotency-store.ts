/** One stored response: what a replay sends back. Header names are as first sent (their case, on Express); match them without regard to case. */
export interface StoredResponse {
  status: number;
  headers: Array<[name: string, value: string]>;
  /** The body bytes exactly as first sent; `null` when there was no body at all. */
  body: Buffer | null;
}

/** Identifies a claim: the key in its tenant, and the token of the attempt that owns it. */
export interface ClaimRef {
  tenant: string;
  key: string;
  ownerToken: string;
}

export interface ClaimRequest extends ClaimRef {
  fingerprint: string;
  leaseMs: number;
  ttlMs: number;
}

/** The phases an attempt recorded (see `Phases`): the last one done, and every result so far. */
export interface PhaseState {
  recoveryPoint: string | null;
  results: Record<string, unknown>;
}

/**
 * The state of the key as the claim found it (the state table in the README).
 * - `claimed`: this attempt owns the key (new, expired, or taken over).
 * - `in-flight`: another attempt holds a valid lease.
 * - `completed`: a stored response exists for the same fingerprint.
 * - `mismatch`: the key is in use by a request with another fingerprint.
 */
export type ClaimResult =
  /**
   * `phases` carries what a predecessor recorded when this claim took the key
   * over. `generation` names this use of the key: kept by a takeover, new
   * when the key was absent or expired (it feeds derived downstream keys).
   */
  | { state: 'claimed'; attempt: number; generation: string; phases: PhaseState }
  | { state: 'in-flight'; retryAfterSeconds: number }
  /**
   * `recordExpiresInSeconds`: how long the stored record has left, whole
   * seconds by the database's clock, when the store can tell (a replay may
   * be remembered no longer).
   */
  | { state: 'completed'; response: StoredResponse; recordExpiresInSeconds?: number }
  | { state: 'mismatch' };

/** How an attempt claims its key: committed alone before the work's transaction, or as that transaction's first statement. */
export type ClaimMode = 'separate' | 'request-transaction';

/**
 * An attempt between its claim and its end: the work's open transaction, which
 * ends exactly once, by `commit` or by `rollback(false)`.
 */
export interface OpenAttempt<Tx> {
  /** The work's transaction. */
  readonly tx: Tx;
  /**
   * Completes the key with `response`, fenced by the owner token, and commits
   * the transaction with it (in one round trip where the store can).
   *
   * @returns false when the fence failed (the key is no longer this
   *   attempt's): the transaction was rolled back, nothing committed
   * @throws the database's error when it refused the completion or the COMMIT
   *   (nothing committed), or a connection error (the outcome is unknown)
   */
  commit(response: StoredResponse, ttlMs: number): Promise<boolean>;
  /**
   * Undoes the work's writes. With `keepClaim`, a store whose claim is a
   * statement of this transaction (claim mode `request-transaction`) may keep
   * the claim and its row lock, and the transaction open, so that `commit`
   * can then store a failure's response with no moment at which a waiting
   * duplicate finds the key free.
   *
   * @returns true when the transaction is still open with the claim in it
   *   (end it with `commit` or `rollback(false)`); false when it has ended
   */
  rollback(keepClaim: boolean): Promise<boolean>;
  /**
   * Ends the attempt from outside while its work may still be running (it
   * held its key past `maxHold`): the transaction rolls back, whatever the
   * work is doing, and the key is free for a retry. After it, `commit`
   * answers false. Optional: a store without it cannot bound how long a
   * request-transaction attempt holds its key.
   */
  abort?(): Promise<void>;
  /**
   * The transaction holds the key's lock, which every claim that would take
   * the key over needs: a live attempt is never taken over, whatever its
   * lease, so the engine ends it at `maxHold` (with `abort`) instead of
   * letting its lease run out.
   */
  readonly holdsKeyLock?: boolean;
}

/** What `begin` found: the key's state, and the open attempt when the claim is this attempt's. */
export type BeginResult<Tx> =
  | { claim: Extract<ClaimResult, { state: 'claimed' }>; attempt: OpenAttempt<Tx> }
  | { claim: Exclude<ClaimResult, { state: 'claimed' }>; attempt?: undefined };

export interface SweepOptions {
  batchSize: number;
  maxDurationMs: number;
  /**
   * Share of the run spent deleting, from 0 (exclusive) to 1: after a batch
   * that took t ms the sweeper rests t × (1 − d) / d ms, leaving the
   * database's CPU and I/O to requests. Default 1 (no rest).
   */
  dutyCycle?: number;
}

export interface SweepResult {
  /** False when another process held the sweep lock, so this call did nothing. */
  ran: boolean;
  deleted: number;
  batches: number;
  durationMs: number;
  /** Of `durationMs`, the time spent resting between batches (see `dutyCycle`). */
  restedMs: number;
  /**
   * A partitioned key table's run: partitions made ahead, partitions retired
   * (dropped whole; `retiredKeys` is PostgreSQL's estimate of their rows), and
   * whether a retirement was put off because its lock was not granted in time.
   * `deleted` and `batches` then count the default partition's sweep only.
   */
  partitions?: { made: number; retired: number; retiredKeys: number; postponed: boolean };
}

/**
 * Where keys live. Abstract class rather than interface so it doubles as the
 * DI token: `providers: [{ provide: IdempotencyStore, useClass: MyStore }]`.
 *
 * Implementations must make `claim` a single atomic step committed on its own,
 * and fence `complete` by the owner token so that an attempt whose key was
 * taken over can never write its response.
 *
 * @typeParam Tx the transaction handle handed to the work (for the TypeORM
 *   store, an `EntityManager`).
 */
export abstract class IdempotencyStore<Tx = unknown> {
  /**
   * Claims the key or reports its state, in one round trip when possible.
   * Without `tx` the claim commits on its own. With `tx` (claim mode
   * `request-transaction`) it is a statement of that transaction: a
   * concurrent claim of the same key waits on it at most `lockTimeoutMs`,
   * then reads as in flight. A store that cannot do that throws.
   */
  abstract claim(request: ClaimRequest, tx?: Tx, lockTimeoutMs?: number): Promise<ClaimResult>;

  /**
   * Extends the lease of a claim this attempt still owns (the heartbeat of a
   * long handler); resolves to false when it no longer does. Optional: a
   * store without it has no heartbeat, and a slow attempt may be taken over
   * once its lease ends.
   */
  renewLease?(ref: ClaimRef, leaseMs: number): Promise<boolean>;

  /** Runs `work` in one database transaction; commits if it resolves, rolls back if it throws. */
  abstract transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;

  /**
   * Claims the key and, when the claim is this attempt's, opens the work's
   * transaction: the start of one attempt (see `OpenAttempt` for its end).
   * With `'separate'` the claim commits on its own before the transaction
   * opens; with `'request-transaction'` it is the transaction's first
   * statement, and a concurrent claim of the same key waits on it at most
   * `lockTimeoutMs`, then reads as in flight.
   *
   * Optional: a store that can claim and open its transaction in fewer round
   * trips implements it (the PostgreSQL store sends the claim, its COMMIT and
   * the BEGIN as one message); otherwise the engine uses `beginAttempt`, one
   * call of `claim` and a transaction opened with `transaction`.
   */
  begin?(request: ClaimRequest, mode: ClaimMode, lockTimeoutMs?: number): Promise<BeginResult<Tx>>;

  /**
   * Marks the key completed with `response`, only if `ref.ownerToken` still
   * owns it. With `tx`, the write joins that transaction. Resolves to false
   * when the fence failed (the key was taken over or released).
   */
  abstract complete(ref: ClaimRef, response: StoredResponse, ttlMs: number, tx?: Tx): Promise<boolean>;

  /**
   * Records a completed phase (its name as the recovery point, and all phase
   * results), fenced by the owner token and renewing the lease. With `tx`, it
   * joins the phase's transaction. Resolves to false when the fence failed.
   */
  abstract recordPhase(ref: ClaimRef, phases: PhaseState, leaseMs: number, tx?: Tx): Promise<boolean>;

  /**
   * Gives the claim back if `ref.ownerToken` still owns it and it is in
   * flight: the work never ran, or was rejected before it started. A first
   * attempt's claim is deleted, so a retry runs at once, even with another
   * request; a takeover's keeps the key's history (generation, attempts,
   * recovery points) with its lease ended, so the next retry takes it over at
   * once. With `forget`, the claim is deleted whatever it carries (a poison
   * message dead-lettered: a redrive is a new use of its key).
   */
  abstract release(ref: ClaimRef, forget?: boolean): Promise<boolean>;

  /** Deletes expired records in bounded batches; at most one process sweeps at a time. */
  abstract sweep(options: SweepOptions): Promise<SweepResult>;

  /**
   * Counts the expired records waiting for the sweeper, at most `limit` (for
   * health checks). Optional: without it the health check reports no backlog.
   */
  countExpired?(limit: number): Promise<number>;

  /** Whether `error` means the store cannot be reached (answered 503), rather than a bug. */
  abstract isUnavailableError(error: unknown): boolean;
}
