import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { sleep } from '../../support/http.js';
import { freePort, killOnExit } from './sample-process.js';

const CANDIDATES = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];
const READY_TIMEOUT_MS = 15_000;

/**
 * A PgBouncer in transaction pooling in front of one database of the
 * server at `serverUrl`, on a free loopback port, run as the `postgres` OS
 * user (it refuses root). Works with a trust server (CI's) and a password
 * one (the embedded server): clients are trusted on loopback, and the
 * server password, if any, goes in the database's connection line.
 */
export class PgBouncer {
  private readonly output: string[] = [];
  private exited = false;

  private constructor(
    private readonly child: ChildProcess,
    private readonly dir: string,
    /** URL of the database through PgBouncer. */
    readonly url: string,
  ) {
    for (const stream of [child.stdout, child.stderr]) {
      stream?.setEncoding('utf8');
      stream?.on('data', (chunk: string) => {
        this.output.push(...chunk.split('\n').filter(Boolean));
        this.output.splice(0, Math.max(0, this.output.length - 200));
      });
    }
    child.once('exit', () => (this.exited = true));
    killOnExit(child);
  }

  static async start(serverUrl: string, options: { poolSize?: number } = {}): Promise<PgBouncer> {
    const binary = CANDIDATES.find((path) => existsSync(path));
    if (!binary) {
      throw new Error('pgbouncer is not installed: `apt-get install -y pgbouncer` (Debian), as .ci/run does before this suite.');
    }
    const server = new URL(serverUrl);
    const database = decodeURIComponent(server.pathname.slice(1));
    const user = decodeURIComponent(server.username || 'postgres');
    const password = decodeURIComponent(server.password);
    const port = await freePort();
    const dir = await mkdtemp(join(tmpdir(), 'reliability-pgbouncer-'));
    // Readable by the postgres user that PgBouncer runs as.
    await chmod(dir, 0o755);
    const quote = (value: string) => `'${value.replace(/'/g, "''")}'`;
    const target = [
      `host=${server.hostname}`,
      `port=${server.port || 5432}`,
      `dbname=${quote(database)}`,
      `user=${quote(user)}`,
      ...(password ? [`password=${quote(password)}`] : []),
    ].join(' ');
    await writeFile(join(dir, 'userlist.txt'), `"${user}" ""\n`, { mode: 0o644 });
    await writeFile(
      join(dir, 'pgbouncer.ini'),
      [
        '[databases]',
        `${database} = ${target}`,
        '[pgbouncer]',
        'listen_addr = 127.0.0.1',
        `listen_port = ${port}`,
        'unix_socket_dir =',
        'auth_type = trust',
        `auth_file = ${join(dir, 'userlist.txt')}`,
        'pool_mode = transaction',
        // Its admin console (database `pgbouncer`) shows the pooled transactions.
        `admin_users = ${user}`,
        `default_pool_size = ${options.poolSize ?? 20}`,
        'max_client_conn = 500',
        // node-postgres sends neither, but drivers often do; PgBouncer refuses unknown startup parameters.
        'ignore_startup_parameters = extra_float_digits,options',
        'log_connections = 0',
        'log_disconnections = 0',
        '',
      ].join('\n'),
      { mode: 0o644 },
    );
    const isRoot = process.getuid?.() === 0;
    const child = spawn(binary, [join(dir, 'pgbouncer.ini')], {
      stdio: ['ignore', 'pipe', 'pipe'],
      cwd: dir,
      ...(isRoot ? { uid: osId('-u'), gid: osId('-g') } : {}),
    });
    const clientUrl = new URL(serverUrl);
    clientUrl.hostname = '127.0.0.1';
    clientUrl.port = String(port);
    const bouncer = new PgBouncer(child, dir, clientUrl.toString());
    try {
      await bouncer.waitReady();
    } catch (error) {
      await bouncer.stop();
      throw error;
    }
    return bouncer;
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  logs(): string {
    return `--- pgbouncer (pid ${this.pid}) ---\n${this.output.join('\n')}`;
  }

  async stop(): Promise<void> {
    if (!this.exited) {
      const exit = new Promise((resolve) => this.child.once('exit', resolve));
      this.child.kill('SIGTERM');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 3_000);
      await exit;
      clearTimeout(timer);
    }
    await rm(this.dir, { recursive: true, force: true });
  }

  private async waitReady(): Promise<void> {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    let last = '';
    while (Date.now() < deadline) {
      if (this.exited) throw new Error(`pgbouncer exited at start.\n${this.logs()}`);
      const client = new pg.Client({ connectionString: this.url, connectionTimeoutMillis: 2_000 });
      client.on('error', () => undefined);
      try {
        await client.connect();
        await client.query('SELECT 1');
        return;
      } catch (error) {
        last = (error as Error).message;
      } finally {
        await client.end().catch(() => undefined);
      }
      await sleep(100);
    }
    throw new Error(`pgbouncer did not accept a query within ${READY_TIMEOUT_MS} ms (last: ${last}).\n${this.logs()}`);
  }
}

function osId(flag: '-u' | '-g'): number {
  try {
    return Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }).trim());
  } catch {
    throw new Error('PgBouncer refuses to run as root and there is no `postgres` OS user to run it as.');
  }
}
