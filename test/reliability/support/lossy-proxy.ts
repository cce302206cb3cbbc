import type { Socket } from 'node:net';
import { LoopbackProxy } from '../../support/loopback-proxy.js';

/**
 * A loopback TCP proxy in front of one HTTP server that loses a fraction of
 * responses *after the server acted*: the request is forwarded whole, the
 * server's answer is swallowed, and the client's connection is reset. That
 * is the worst case for a retrying client: the effect happened, the client
 * cannot know. One HTTP exchange per connection (clients must not keep
 * connections alive), so the decision is per request.
 */
export class LossyProxy extends LoopbackProxy {
  private readonly random: () => number;
  readonly stats = { connections: 0, forwarded: 0, dropped: 0 };

  /**
   * @param dropRate the fraction of connections whose response is lost
   * @param seed seeds the choice, so a run can be replayed
   */
  constructor(
    targetPort: number,
    private readonly dropRate: number,
    seed: number,
  ) {
    super(targetPort);
    this.random = mulberry32(seed);
  }

  protected relay(client: Socket, upstream: Socket): void {
    this.stats.connections++;
    const drop = this.random() < this.dropRate;
    client.pipe(upstream);
    if (!drop) {
      upstream.pipe(client);
      upstream.once('data', () => this.stats.forwarded++);
      return;
    }
    // The first byte of the answer proves the server acted (the module stores before it sends); lose it.
    upstream.once('data', () => {
      this.stats.dropped++;
      upstream.destroy();
      client.resetAndDestroy();
    });
  }
}

/** A small seeded PRNG (mulberry32): the same seed gives the same drops. */
function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
