import { connect, createServer, type Server, type Socket } from 'node:net';

/**
 * A TCP proxy on loopback in front of one target, for fault tests: each
 * subclass decides in `relay` what happens to the bytes of a connection (pass
 * them, drop an answer, cut a COMMIT, inject an error). It tracks every
 * socket so `stop` can drop all connections at once, and keeps its port, so
 * `start` after `stop` accepts again where clients expect it.
 */
export abstract class LoopbackProxy {
  private server?: Server;
  private readonly sockets = new Set<Socket>();
  port = 0;

  constructor(
    protected readonly targetPort: number,
    protected readonly targetHost = '127.0.0.1',
  ) {}

  async start(): Promise<void> {
    if (this.server) return;
    const server = createServer((client) => this.accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', resolve);
    });
    this.server = server;
    const address = server.address();
    if (address && typeof address === 'object') this.port = address.port;
  }

  /** Drops every connection and stops accepting new ones (connection refused). */
  async stop(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    this.sockets.clear();
    const server = this.server;
    this.server = undefined;
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  }

  /** Wires one accepted connection to its upstream; both sockets are already tracked and torn down together. */
  protected abstract relay(client: Socket, upstream: Socket): void;

  private accept(client: Socket): void {
    const upstream = connect(this.targetPort, this.targetHost);
    for (const socket of [client, upstream]) {
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
      socket.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    this.relay(client, upstream);
  }
}
