import { fork, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { AdapterName } from './config.js';
import type { AppEvent, AppReply, PoolPeak, RunnerRequest, WithoutId } from './protocol.js';

/** The app under test in its own process, and the runner's handle on it. */
export class AppProcess {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (reply: AppReply) => void; reject: (error: Error) => void }>();
  private exited = false;

  private constructor(
    private readonly child: ChildProcess,
    readonly adapter: AdapterName,
    readonly url: string,
    readonly poolMax: number,
  ) {
    child.on('message', (message: AppReply) => {
      this.pending.get(message.id)?.resolve(message);
      this.pending.delete(message.id);
    });
    // A crashed app must fail the run, not leave it waiting for an answer forever.
    child.on('exit', (code, signal) => {
      this.exited = true;
      for (const { reject } of this.pending.values()) reject(new Error(`The ${adapter} bench app exited (${signal ?? code}).`));
      this.pending.clear();
    });
  }

  static async start(options: {
    adapter: AdapterName;
    databaseUrl: string;
    schema: string;
    poolSize: number;
    /** More settings of the app, e.g. `BENCH_RESERVED_CONNECTIONS`, `BENCH_SERVICE_URL`. */
    env?: Record<string, string>;
  }): Promise<AppProcess> {
    const script = fileURLToPath(new URL('./bench-app.js', import.meta.url));
    const child = fork(script, [], {
      env: {
        ...process.env,
        DATABASE_URL: options.databaseUrl,
        BENCH_SCHEMA: options.schema,
        HTTP_ADAPTER: options.adapter,
        BENCH_POOL_SIZE: String(options.poolSize),
        ...options.env,
      },
      // e.g. BENCH_APP_NODE_ARGS=--cpu-prof to profile the app alone.
      execArgv: (process.env.BENCH_APP_NODE_ARGS ?? '').split(' ').filter(Boolean),
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const ready = await new Promise<Extract<AppEvent, { type: 'ready' }>>((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`The ${options.adapter} bench app exited during start-up (code ${code}).`)));
      child.once('message', (event: AppEvent) => {
        if (event.type === 'ready') resolve(event);
        else reject(new Error(`The ${options.adapter} bench app failed to start:\n${event.error}`));
      });
    });
    child.removeAllListeners('exit');
    return new AppProcess(child, options.adapter, `http://127.0.0.1:${ready.port}`, ready.poolMax);
  }

  async poolWatchStart(): Promise<void> {
    await this.request({ type: 'pool-watch-start' });
  }

  async poolWatchStop(): Promise<PoolPeak> {
    return expect(await this.request({ type: 'pool-watch-stop' }), 'pool-peak').peak;
  }

  async countStart(): Promise<void> {
    await this.request({ type: 'count-start' });
  }

  async countStop(): Promise<string[]> {
    return expect(await this.request({ type: 'count-stop' }), 'queries').queries;
  }

  /** Resolves once no pooled connection has been in use for a few polls: requests left over from a load run are done. */
  async quiet(): Promise<void> {
    for (let idlePolls = 0; idlePolls < 3;) {
      const state = expect(await this.request({ type: 'pool-state' }), 'pool-state');
      idlePolls = state.inUse === 0 && state.waiting === 0 ? idlePolls + 1 : 0;
      await sleep(20);
    }
  }

  /** CPU the app process has used so far (user + system), in microseconds. */
  async cpuMicros(): Promise<number> {
    return expect(await this.request({ type: 'cpu' }), 'cpu').micros;
  }

  /** Promises the app has created so far, when it counts them (`BENCH_COUNT_PROMISES=1`); else undefined. */
  async promisesCreated(): Promise<number | undefined> {
    return expect(await this.request({ type: 'cpu' }), 'cpu').promises;
  }

  /** Starts the app's CPU profiler (see bench/profile.ts). */
  async profileStart(): Promise<void> {
    await this.request({ type: 'profile-start' });
  }

  /** Stops the app's CPU profiler and has it write the profile (`.cpuprofile`, Chrome DevTools' format) to `path`. */
  async profileStop(path: string): Promise<void> {
    await this.request({ type: 'profile-stop', path });
  }

  /** Asks the app to close (Nest shutdown, pool ended) and waits for its process to exit. */
  async close(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    // No reply to wait for: the app exits once closed, which is the answer.
    this.request({ type: 'close' }).catch(() => undefined);
    await exited;
  }

  private request(message: WithoutId<RunnerRequest>): Promise<AppReply> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      if (this.exited) return reject(new Error(`The ${this.adapter} bench app is not running.`));
      this.pending.set(id, { resolve, reject });
      this.child.send({ ...message, id } as RunnerRequest);
    });
  }
}

function expect<T extends AppReply['type']>(reply: AppReply, type: T): Extract<AppReply, { type: T }> {
  if (reply.type !== type) throw new Error(`The bench app answered ${reply.type} where ${type} was expected.`);
  return reply as Extract<AppReply, { type: T }>;
}

/** The slow local HTTP service of the realistic handler (slow-service.ts), in a process of its own. */
export class SlowService {
  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
  ) {}

  static async start(delayMs: number): Promise<SlowService> {
    const script = fileURLToPath(new URL('./slow-service.js', import.meta.url));
    const child = fork(script, [], {
      env: { ...process.env, BENCH_SERVICE_DELAY_MS: String(delayMs) },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const port = await new Promise<number>((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`The slow service exited during start-up (code ${code}).`)));
      child.once('message', (event: { type: 'ready'; port: number }) => resolve(event.port));
    });
    child.removeAllListeners('exit');
    return new SlowService(child, `http://127.0.0.1:${port}/authorizations`);
  }

  async close(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill();
    await exited;
  }
}
