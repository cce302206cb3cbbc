import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';

export interface ProviderCall {
  method: string;
  path: string;
  key: string | undefined;
}

/**
 * Another company's API in miniature: records every call with its
 * Idempotency-Key, and deduplicates keyed POSTs as Stripe does (the same key
 * answers the same charge), so a test can count what the provider did.
 */
export class RecordingProvider {
  readonly calls: ProviderCall[] = [];
  /** Charges made, by key (unkeyed calls each make one under a key of their own). */
  readonly charges = new Map<string, string>();
  private server?: Server;
  url = '';

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const header = req.headers['idempotency-key'];
      const key = Array.isArray(header) ? header.join(',') : header;
      const path = new URL(req.url ?? '/', 'http://provider').pathname;
      this.calls.push({ method: req.method ?? '', path, key });
      req.resume();
      req.on('end', () => {
        const chargeKey = key ?? `unkeyed-${this.calls.length}`;
        if (!this.charges.has(chargeKey)) this.charges.set(chargeKey, `py_${randomBytes(6).toString('hex')}`);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: this.charges.get(chargeKey) }));
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }

  /** Calls whose path is `path`, in order. */
  callsTo(path: string): ProviderCall[] {
    return this.calls.filter((call) => call.path === path);
  }

  stop(): Promise<void> {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
