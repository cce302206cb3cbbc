import { integer, pgTable, serial, text } from 'drizzle-orm/pg-core';

// The example's tables, as Drizzle's docs write them; drizzle/ holds their migration.
export const payouts = pgTable('payouts', {
  id: serial('id').primaryKey(),
  account: text('account').notNull(),
  amount: integer('amount').notNull(),
});

export const ledgerEntries = pgTable('ledger_entries', {
  id: serial('id').primaryKey(),
  account: text('account').notNull(),
  amount: integer('amount').notNull(),
});

export const schema = { payouts, ledgerEntries };
