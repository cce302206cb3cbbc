import type { Socket } from 'node:net';
import { LoopbackProxy } from './loopback-proxy.js';

/**
 * A plain proxy in front of PostgreSQL, so a test can cut the database off
 * from the app (every connection dropped, new ones refused) and bring it back
 * on the same port.
 */
export class TcpProxy extends LoopbackProxy {
  protected relay(client: Socket, upstream: Socket): void {
    client.pipe(upstream).pipe(client);
  }

  /** Drops every connection and refuses new ones. */
  cut(): Promise<void> {
    return this.stop();
  }

  /** Accepts connections again, on the same port. */
  restore(): Promise<void> {
    return this.start();
  }
}

/** The URL of `url` with its host and port replaced by the proxy's. */
export function throughProxy(url: string, proxy: TcpProxy): string {
  const parsed = new URL(url);
  parsed.hostname = '127.0.0.1';
  parsed.port = String(proxy.port);
  return parsed.toString();
}
