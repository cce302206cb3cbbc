import type { Subscriber } from 'rxjs';

/**
 * The Observable Nest subscribed to, answered once: a value (then
 * completion), an error for the app's filters, or nothing more. Whatever
 * comes after the first answer is dropped.
 */
export class OnceSubscriber {
  private done = false;
  /** Whether a value (not an error) was handed on. */
  emitted = false;

  constructor(private readonly subscriber: Subscriber<unknown>) {}

  emit(value: unknown): void {
    if (!this.settle()) return;
    this.emitted = true;
    this.subscriber.next(value);
    this.subscriber.complete();
  }

  fail(error: unknown): void {
    if (this.settle()) this.subscriber.error(error);
  }

  /** Ends with no value: completes the Observable, or (`complete` false) leaves it open and answers nothing. */
  end(complete = true): void {
    if (this.settle() && complete) this.subscriber.complete();
  }

  /** A value of a handler run without a key, passed on as it comes. */
  pass(value: unknown): void {
    if (!this.done) this.subscriber.next(value);
  }

  private settle(): boolean {
    if (this.done) return false;
    this.done = true;
    return true;
  }
}
