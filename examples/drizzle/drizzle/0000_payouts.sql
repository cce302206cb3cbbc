CREATE TABLE "payouts" (
	"id" serial PRIMARY KEY NOT NULL,
	"account" text NOT NULL,
	"amount" integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE "ledger_entries" (
	"id" serial PRIMARY KEY NOT NULL,
	"account" text NOT NULL,
	"amount" integer NOT NULL
);
