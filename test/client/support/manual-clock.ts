import type { ClientClock } from '../../../src/client/index.js';

interface Timer {
  at: number;
  order: number;
  callback: () => void;
}

/**
 * A clock that moves only when told, for the client's unit tests: `run()`
 * drives a promise to completion, jumping straight to the next timer
 * whenever nothing else can happen, so a test of a 30 s deadline takes
 * milliseconds and its waits can be read off `now()` exactly.
 */
export class ManualClock implements ClientClock {
  private time: number;
  private order = 0;
  private timers: Timer[] = [];

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.time = start;
  }

  now(): number {
    return this.time;
  }

  schedule(ms: number, callback: () => void): () => void {
    const timer = { at: this.time + Math.max(0, ms), order: this.order++, callback };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  /** Moves time forward by `ms`, firing every timer due on the way, in order. */
  advance(ms: number): void {
    const until = this.time + ms;
    for (let next = this.nextTimer(); next && next.at <= until; next = this.nextTimer()) this.fire(next);
    this.time = until;
  }

  /** Settles `work`, firing timers one at a time whenever the work is idle. */
  async run<T>(work: Promise<T>): Promise<T> {
    let settled = false;
    work.then(
      () => (settled = true),
      () => (settled = true),
    );
    for (;;) {
      await idle();
      if (settled) return work;
      const next = this.nextTimer();
      if (!next) throw new Error('ManualClock: the work is waiting on something other than a timer of this clock.');
      this.fire(next);
    }
  }

  private nextTimer(): Timer | undefined {
    return [...this.timers].sort((a, b) => a.at - b.at || a.order - b.order)[0];
  }

  private fire(timer: Timer): void {
    this.timers = this.timers.filter((t) => t !== timer);
    this.time = Math.max(this.time, timer.at);
    timer.callback();
  }
}

/** Lets every pending promise job and immediate run (reading a Response body takes a few turns). */
async function idle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
}
