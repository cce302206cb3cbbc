import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { databaseUrl } from './database.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/**
 * A test app (a TypeScript file of test/support that prints `listening <port>`
 * once up, or `failed <name>: <message>`) as an OS process of its own: apps
 * on nestjs-cls, which does not load under Jest's ESM mode on Node 20.
 */
export class AppProcess {
  readonly output: string[] = [];
  url = '';
  private readonly child: ChildProcess;
  private readonly waiting: Array<{ pattern: RegExp; resolve: (line: string | undefined) => void }> = [];
  private stderr = '';
  private readonly closed: Promise<void>;
  private exited = false;

  constructor(script: string, env: Record<string, string>) {
    this.child = spawn(process.execPath, ['test/support/run-typescript.mjs', script], {
      cwd: ROOT,
      // Jest's --experimental-vm-modules is not for the child.
      env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: databaseUrl(), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      this.output.push(line);
      const waiter = this.waiting.find((w) => w.pattern.test(line));
      if (!waiter) return;
      this.waiting.splice(this.waiting.indexOf(waiter), 1);
      waiter.resolve(line);
    });
    this.closed = new Promise((resolve) =>
      this.child.once('close', () => {
        this.exited = true;
        for (const waiter of this.waiting.splice(0)) waiter.resolve(undefined);
        resolve();
      }),
    );
  }

  /** Starts the app and waits until it listens; throws with its output if it does not. */
  static async start(script: string, env: Record<string, string>): Promise<AppProcess> {
    const app = new AppProcess(script, env);
    const line = await app.line(/^(listening \d+|failed )/);
    if (!line?.startsWith('listening')) throw new Error(`the app did not start:\n${app.output.join('\n')}\n${app.stderr}`);
    app.url = `http://127.0.0.1:${line.split(' ')[1]}`;
    return app;
  }

  /** The first line matching `pattern`, printed before or after this call; undefined once the process has exited without it. */
  line(pattern: RegExp): Promise<string | undefined> {
    const seen = this.output.find((line) => pattern.test(line));
    if (seen !== undefined || this.exited) return Promise.resolve(seen);
    return new Promise((resolve) => this.waiting.push({ pattern, resolve }));
  }

  /** Resolves once the process has exited, with its signal. */
  async exit(): Promise<NodeJS.Signals | null> {
    await this.closed;
    return this.child.signalCode;
  }

  async stop(): Promise<void> {
    if (!this.exited) this.child.kill('SIGKILL');
    await this.closed;
  }
}
