import type { Subscriber } from 'rxjs';

/** The Observable Nest subscribed to, answered once: a value (then completion) or an error; anything later is dropped. */
export class OnceSubscriber {
  protected done = false;
  /** Whether a value (not an error) was handed on. */
  emitted = false;

  constructor(protected readonly subscriber: Subscriber<unknown>) {}

  emit(value: unknown): void {
    if (!this.settle()) return;
    this.emitted = true;
    this.subscriber.next(value);
    this.subscriber.complete();
  }

  fail(error: unknown): void {
    if (this.settle()) this.subscriber.error(error);
  }

  protected settle(): boolean {
    if (this.done) return false;
    this.done = true;
    return true;
  }
}
