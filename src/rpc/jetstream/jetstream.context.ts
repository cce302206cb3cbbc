import { BaseRpcContext } from '@nestjs/microservices';
import type { JsMsg } from '@nats-io/jetstream';

/** How the server settles a message; one of them at most, once. */
export interface JetStreamSettlement {
  ack(): void;
  retry(delayMs: number): void;
  deadLetter(reason: string): Promise<void>;
}

/**
 * The RPC context of a message delivered by `JetStreamServer`. A handler (or
 * the idempotent message interceptor) settles it with `ack`, `retry` or
 * `deadLetter`; a handler that settles nothing gets it acknowledged when it
 * completes and redelivered when it fails.
 */
export class JetStreamContext extends BaseRpcContext<[JsMsg, string]> {
  private settledAs: 'ack' | 'retry' | 'dead-letter' | undefined;

  constructor(
    args: [JsMsg, string],
    private readonly settlement: JetStreamSettlement,
  ) {
    super(args);
  }

  /** The stored message, with its headers, sequence and delivery info (`info.deliveryCount`). */
  getJetStreamMessage(): JsMsg {
    return this.args[0];
  }

  getSubject(): string {
    return this.args[1];
  }

  getHeaders(): JsMsg['headers'] {
    return this.args[0].headers;
  }

  /** How it was settled so far, if at all. */
  get settled(): 'ack' | 'retry' | 'dead-letter' | undefined {
    return this.settledAs;
  }

  /** Done: JetStream forgets it. */
  ack(): void {
    if (this.settle('ack')) this.settlement.ack();
  }

  /** Deliver it again after `delayMs` (a nak with a delay: JetStream waits, nothing is held here). */
  retry(delayMs: number): void {
    if (this.settle('retry')) this.settlement.retry(delayMs);
  }

  /**
   * Republish it to the server's dead-letter subject, then terminate it here,
   * so it is kept where an operator can replay it and never delivered to this
   * consumer again. If the copy cannot be published the message is retried
   * instead: never dropped.
   */
  deadLetter(reason: string): Promise<void> {
    return this.settle('dead-letter') ? this.settlement.deadLetter(reason) : Promise.resolve();
  }

  private settle(as: 'ack' | 'retry' | 'dead-letter'): boolean {
    if (this.settledAs) return false;
    this.settledAs = as;
    return true;
  }
}
