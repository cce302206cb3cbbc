import type { Socket } from 'node:net';
import { LoopbackProxy } from './loopback-proxy.js';

/** One write of a client and what the server answered to it. */
export interface WireExchange {
  /** Which connection (in the order they were opened). */
  connection: number;
  /** The statements the write carried: each Parse's or simple Query's text, in order. */
  statements: string[];
  /**
   * The transaction status of each ReadyForQuery the server answered it with: `I` idle (no transaction open), `T` in
   * a transaction block, `E` in a failed one.
   */
  ready: string[];
}

/**
 * A proxy in front of PostgreSQL that reads the protocol both ways and records
 * what the server saw: each write of a client (one round trip: node-postgres
 * corks a query's, or a pipeline's, messages into one) with the statements it
 * carried, and the transaction status the server reported after each. It
 * counts what reaches the server, whatever the app logs.
 */
export class WireCounter extends LoopbackProxy {
  exchanges: WireExchange[] = [];
  private connections = 0;

  reset(): void {
    this.exchanges = [];
  }

  /** The exchanges since the last reset, as statements (without their comments and whitespace runs) and statuses. */
  summary(): Array<{ statements: string[]; ready: string[] }> {
    return this.exchanges.map(({ statements, ready }) => ({
      statements: statements.map((text) => text.replace(/\s+/g, ' ').trim()),
      ready,
    }));
  }

  protected relay(client: Socket, upstream: Socket): void {
    const connection = ++this.connections;
    let current: WireExchange | undefined;
    let started = false;
    let fromClient = Buffer.alloc(0);
    let fromServer = Buffer.alloc(0);
    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk);
      fromClient = Buffer.concat([fromClient, chunk]);
      const statements: string[] = [];
      let requests = 0;
      for (;;) {
        if (!started) {
          // The startup message has no type byte.
          if (fromClient.length < 4) break;
          const length = fromClient.readInt32BE(0);
          if (fromClient.length < length) break;
          fromClient = fromClient.subarray(length);
          started = true;
          continue;
        }
        if (fromClient.length < 5) break;
        const type = String.fromCharCode(fromClient[0]);
        const length = fromClient.readInt32BE(1);
        if (fromClient.length < length + 1) break;
        const body = fromClient.subarray(5, length + 1);
        fromClient = fromClient.subarray(length + 1);
        if (type === 'Q') {
          statements.push(body.subarray(0, body.indexOf(0)).toString());
          requests++;
        } else if (type === 'P') {
          const nameEnd = body.indexOf(0);
          statements.push(body.subarray(nameEnd + 1, body.indexOf(0, nameEnd + 1)).toString());
        } else if (type === 'S') requests++;
      }
      if (requests > 0 || statements.length > 0) {
        current = { connection, statements, ready: [] };
        this.exchanges.push(current);
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      client.write(chunk);
      fromServer = Buffer.concat([fromServer, chunk]);
      for (;;) {
        if (fromServer.length < 5) break;
        const type = String.fromCharCode(fromServer[0]);
        const length = fromServer.readInt32BE(1);
        if (fromServer.length < length + 1) break;
        if (type === 'Z' && current) current.ready.push(String.fromCharCode(fromServer[5]));
        fromServer = fromServer.subarray(length + 1);
      }
    });
    client.on('end', () => upstream.end());
    upstream.on('end', () => client.end());
  }
}

/** The URL of `url` through `proxy`. */
export function throughWireCounter(url: string, proxy: WireCounter): string {
  const parsed = new URL(url);
  parsed.hostname = '127.0.0.1';
  parsed.port = String(proxy.port);
  return parsed.toString();
}
