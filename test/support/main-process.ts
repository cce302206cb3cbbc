import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../reliability/support/sample-process.js';
import { send, sleep } from './http.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BOOT_DEADLINE_MS = 60_000;

/**
 * A program's entry point run as its user runs it (the README's Quick start, an example app's src/main.ts): a
 * TypeScript file in a process of its own (run-typescript.mjs, so its imports of nest-idempotency-pg resolve to src/),
 * told its port by PORT, and taken as started once it answers any HTTP request on `probePath`.
 */
export class MainProcess {
  /** What it printed, stdout and stderr together: shown beside a failed expectation. */
  output = '';

  private constructor(
    private readonly child: ChildProcess,
    readonly baseUrl: string,
  ) {
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (this.output += chunk));
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.output += chunk));
  }

  static async start(
    name: string,
    entry: string,
    options: { cwd: string; env: Record<string, string>; probePath: string },
  ): Promise<MainProcess> {
    const port = await freePort();
    const child = spawn(process.execPath, [join(ROOT, 'test/support/run-typescript.mjs'), entry], {
      cwd: options.cwd,
      // Jest's --experimental-vm-modules is not for the child.
      env: { ...process.env, NODE_OPTIONS: '', ...options.env, PORT: String(port) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const app = new MainProcess(child, `http://127.0.0.1:${port}`);
    const deadline = Date.now() + BOOT_DEADLINE_MS;
    for (;;) {
      if (!app.running()) throw new Error(`${name} exited:\n${app.output}`);
      if (Date.now() > deadline) {
        await app.stop();
        throw new Error(`${name} did not answer within ${BOOT_DEADLINE_MS} ms:\n${app.output}`);
      }
      const answered = await send(app.baseUrl, 'GET', options.probePath).then(
        () => true,
        () => false,
      );
      if (answered) return app;
      await sleep(100);
    }
  }

  /** Ends it as a user's Ctrl-C would (SIGTERM), and waits for it to exit. */
  async stop(): Promise<void> {
    if (!this.running()) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGTERM');
    await exited;
  }

  private running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }
}
