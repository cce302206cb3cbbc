import type { Socket } from 'node:net';
import { LoopbackProxy } from './loopback-proxy.js';

/**
 * A plain proxy in front of PostgreSQL, so a test can cut the database off
 * from the app (every connection dropped, new ones refused) and bring it back
 * on the same port.
 */
export class TcpProxy extends LoopbackProxy {
  private dropOn?: Buffer;

  protected relay(client: Socket, upstream: Socket): void {
    client.on('data', (chunk: Buffer) => {
      if (this.dropOn && chunk.includes(this.dropOn)) {
        // The statement never reaches the server; the app sees its connection die as it sends it.
        this.dropOn = undefined;
        client.destroy();
        upstream.destroy();
        return;
      }
      upstream.write(chunk);
    });
    upstream.pipe(client);
    client.on('end', () => upstream.end());
  }

  /** Kills the next connection that sends a statement containing `text`, before the server sees it. */
  dropConnectionOn(text: string): void {
    this.dropOn = Buffer.from(text);
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
