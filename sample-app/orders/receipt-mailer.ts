import { Injectable, type OnModuleInit } from '@nestjs/common';
import { InjectDataSource } from '@nestjs/typeorm';
import type { DataSource } from 'typeorm';
import { OutboxRelay, type OutboxMessage } from '../../src/outbox/index.js';

interface ReceiptPayload {
  orderId: string;
  email: string;
  amount: number;
}

/**
 * "Sends" receipt emails for the outbox relay by recording each delivery, so
 * tests can count them. Email cannot take an idempotency key, so a receipt
 * may go out more than once (at least once); a real mailer would pass
 * `message.id` to a provider that deduplicates on it, where one exists.
 */
@Injectable()
export class ReceiptMailer implements OnModuleInit {
  constructor(
    private readonly relay: OutboxRelay,
    @InjectDataSource() private readonly dataSource: DataSource,
  ) {}

  onModuleInit(): void {
    this.relay.handle<ReceiptPayload>('receipt.email', (message) => this.send(message));
  }

  private async send(message: OutboxMessage<ReceiptPayload>): Promise<void> {
    await this.dataSource.query('INSERT INTO receipt_deliveries (message_id, order_id, email) VALUES ($1, $2, $3)', [
      message.id,
      message.payload.orderId,
      message.payload.email,
    ]);
  }
}
