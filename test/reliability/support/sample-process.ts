import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { send, sleep } from '../../support/http.js';

export type AdapterName = 'express' | 'fastify';

const REPOSITORY_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
/** Built once per run by the reliability suite's global setup, which passes its path on in SAMPLE_MAIN. */
export const SAMPLE_MAIN = process.env.SAMPLE_MAIN ?? '';
const LOG_LINES_KEPT = 400;
const LOG_LINES_SHOWN = 80;
const STARTUP_NOISE = /\[(InstanceLoader|RoutesResolver|RouterExplorer)\]|^\s+-[Hd] '|^curl /;
const HEALTH_TIMEOUT_MS = 45_000;
const STOP_GRACE_MS = 5_000;

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface SampleProcessOptions {
  /** Names the process in logs and failure messages. */
  name: string;
  databaseUrl: string;
  adapter: AdapterName;
  /** More environment, e.g. `IDEMPOTENCY_LEASE_MS` or `SAMPLE_FAULT_INJECTION`. */
  env?: Record<string, string>;
  /** The script to run instead of the prebuilt main.js, e.g. `sample-app/start.mjs` (what `npm run sample` runs). */
  entry?: string;
  /** How long to wait for `/health` (default 45 s); more when `entry` compiles first. */
  healthTimeoutMs?: number;
  /**
   * `false`: resolve once spawned, without waiting for `/health`, for a
   * process that may die before it serves (a consumer that a poison message
   * kills as soon as it connects to the broker). Default true.
   */
  waitForHealth?: boolean;
}

/** Every child any scenario started, so none outlives the Jest worker even if a test's cleanup never runs. */
const everyChild = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of everyChild) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

/** Kills `child` with the worker if nothing stopped it before (a safety net under afterAll). */
export function killOnExit(child: ChildProcess): void {
  everyChild.add(child);
  child.once('exit', () => everyChild.delete(child));
}

/** One `node dist-sample/<build>/sample-app/main.js` process, with its output kept for failure messages. */
export class SampleProcess {
  readonly url: string;
  readonly exited: Promise<ExitInfo>;
  private readonly output: string[] = [];
  private exitInfo?: ExitInfo;

  private constructor(
    readonly name: string,
    readonly adapter: AdapterName,
    readonly port: number,
    private readonly child: ChildProcess,
  ) {
    this.url = `http://127.0.0.1:${port}`;
    killOnExit(child);
    for (const stream of [child.stdout, child.stderr]) {
      let partial = '';
      stream?.setEncoding('utf8');
      stream?.on('data', (chunk: string) => {
        const lines = (partial + chunk).split('\n');
        partial = lines.pop() ?? '';
        for (const line of lines) this.remember(line);
      });
      stream?.on('end', () => partial && this.remember(partial));
    }
    this.exited = new Promise((resolve) => {
      // 'close' rather than 'exit': by then the output is read to its end, last words included.
      child.once('close', (code, signal) => {
        this.exitInfo = { code, signal };
        this.remember(`[harness] exited with ${signal ?? `code ${code}`}`);
        resolve(this.exitInfo);
      });
    });
  }

  /** Spawns the sample app on a free loopback port and resolves once `/health` answers 200. */
  static async start(options: SampleProcessOptions): Promise<SampleProcess> {
    if (!options.entry && (!SAMPLE_MAIN || !existsSync(SAMPLE_MAIN)))
      throw new Error(
        `The sample app's build (${SAMPLE_MAIN || 'SAMPLE_MAIN unset'}) is missing: run through jest.reliability.config.js, which builds it.`,
      );
    const port = await freePort();
    const child = spawn(process.execPath, [options.entry ?? SAMPLE_MAIN], {
      cwd: REPOSITORY_ROOT,
      env: {
        ...process.env,
        // Jest's --experimental-vm-modules is not for the app.
        NODE_OPTIONS: '',
        NO_COLOR: '1',
        PORT: String(port),
        HTTP_ADAPTER: options.adapter,
        DATABASE_URL: options.databaseUrl,
        SHUTDOWN_TIMEOUT_MS: '2000',
        ...options.env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const sample = new SampleProcess(options.name, options.adapter, port, child);
    if (options.waitForHealth === false) return sample;
    try {
      await sample.waitHealthy(options.healthTimeoutMs);
    } catch (error) {
      await sample.kill('SIGKILL');
      throw error;
    }
    return sample;
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get alive(): boolean {
    return this.exitInfo === undefined;
  }

  /** How it ended, once it has. */
  get exit(): ExitInfo | undefined {
    return this.exitInfo;
  }

  /** Whether it printed a line matching `pattern` (among the last lines kept). */
  printed(pattern: RegExp): boolean {
    return this.output.some((line) => pattern.test(line));
  }

  /** Polls `/health` until 200, failing early (with the process's output) if it exits. */
  async waitHealthy(timeoutMs = HEALTH_TIMEOUT_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = 'no answer yet';
    while (Date.now() < deadline) {
      if (!this.alive) throw new Error(`${this.name} exited before /health answered 200.\n${this.logs()}`);
      try {
        const res = await send(this.url, 'GET', '/health');
        if (res.status === 200) return;
        last = `${res.status} ${res.text()}`;
      } catch (error) {
        last = (error as Error).message;
      }
      await sleep(100);
    }
    throw new Error(`${this.name}: /health did not answer 200 within ${timeoutMs} ms (last: ${last}).\n${this.logs()}`);
  }

  /** Sends `signal` and waits for the process to exit. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<ExitInfo> {
    if (!this.alive) return this.exitInfo!;
    this.child.kill(signal);
    return this.exited;
  }

  /** SIGTERM (the app drains and closes its pool), then SIGKILL if it takes too long. */
  async stop(): Promise<void> {
    if (!this.alive) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_GRACE_MS);
    await this.exited;
    clearTimeout(timer);
  }

  /** The last lines the process printed, for a failure message (without Nest's start-up wiring lines). */
  logs(): string {
    const lines = this.output.filter((line) => !STARTUP_NOISE.test(line)).slice(-LOG_LINES_SHOWN);
    return `--- ${this.name} (${this.adapter}, pid ${this.pid}, port ${this.port}) ---\n${lines.join('\n')}`;
  }

  private remember(line: string): void {
    this.output.push(line);
    if (this.output.length > LOG_LINES_KEPT) this.output.shift();
  }
}

/** The processes of one scenario: started together, stopped together, their output attached to any failure. */
export class Fleet {
  readonly processes: SampleProcess[] = [];

  async start(options: SampleProcessOptions): Promise<SampleProcess> {
    for (let attempt = 1; ; attempt++) {
      try {
        const sample = await SampleProcess.start(options);
        this.processes.push(sample);
        return sample;
      } catch (error) {
        // The free port found was taken before the app bound it: pick another.
        if (attempt >= 3 || !String((error as Error).message).includes('EADDRINUSE')) throw error;
      }
    }
  }

  /**
   * Starts several processes at once. Waits for every start to settle before
   * throwing, so a failed start never leaves another one running unseen by
   * `stopAll()`.
   */
  async startAll(list: SampleProcessOptions[]): Promise<SampleProcess[]> {
    const started = await Promise.allSettled(list.map((options) => this.start(options)));
    const failed = started.find((result) => result.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    return started.map((result) => (result as PromiseFulfilledResult<SampleProcess>).value);
  }

  /** Starts `count` processes at once, alternating Express and Fastify. */
  startMany(count: number, options: Omit<SampleProcessOptions, 'name' | 'adapter'> & { name: string }): Promise<SampleProcess[]> {
    const adapters: AdapterName[] = ['express', 'fastify'];
    return this.startAll(
      Array.from({ length: count }, (_, i) => ({ ...options, name: `${options.name}-${i + 1}`, adapter: adapters[i % 2] })),
    );
  }

  async stopAll(): Promise<void> {
    await Promise.all(this.processes.map((sample) => sample.stop()));
  }

  /** Runs a scenario step; if it throws, the processes' output is added to the error so a failure explains itself. */
  async explain<T>(step: () => Promise<T>): Promise<T> {
    try {
      return await step();
    } catch (error) {
      const logs = this.processes.map((sample) => sample.logs()).join('\n');
      // Duck-typed: assertion errors and node's errors may come from another realm than this module's Error.
      if (error && typeof error === 'object' && typeof (error as Error).message === 'string') {
        (error as Error).message += `\n\nOutput of the scenario's processes:\n${logs}`;
        throw error;
      }
      throw new Error(`${String(error)}\n\nOutput of the scenario's processes:\n${logs}`, { cause: error });
    }
  }
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port'))));
    });
  });
}
