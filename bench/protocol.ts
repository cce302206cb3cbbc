/** Messages between the bench runner and the app under test, over the child process's IPC channel. */

/** Peak use of the TypeORM driver's pg Pool while a watch was on. */
export interface PoolPeak {
  max: number;
  total: number;
  inUse: number;
  waiting: number;
}

export type RunnerRequest =
  | { id: number; type: 'pool-watch-start' }
  | { id: number; type: 'pool-watch-stop' }
  | { id: number; type: 'count-start' }
  | { id: number; type: 'count-stop' }
  | { id: number; type: 'cpu' }
  | { id: number; type: 'pool-state' }
  /** Starts the V8 CPU profiler in the app (bench/profile.ts); `profile-stop` writes the profile to `path`. */
  | { id: number; type: 'profile-start' }
  | { id: number; type: 'profile-stop'; path: string }
  | { id: number; type: 'close' };

export type AppReply =
  | { id: number; type: 'ok' }
  | { id: number; type: 'pool-peak'; peak: PoolPeak }
  | { id: number; type: 'queries'; queries: string[] }
  /** `promises`: promises the app has created so far, when it counts them (`BENCH_COUNT_PROMISES=1`). */
  | { id: number; type: 'cpu'; micros: number; promises?: number }
  | { id: number; type: 'pool-state'; inUse: number; waiting: number };

export type AppEvent = { type: 'ready'; port: number; poolMax: number } | { type: 'failed'; error: string };

/** `Omit` applied to each member of a union, so each reply keeps its own fields. */
export type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never;

/** The pg `application_name` of the app's connections, so the runner can find their backends. */
export const APP_APPLICATION_NAME = 'idempotency-bench-app';
